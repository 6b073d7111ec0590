"""Shared steps of the data preparation scripts (scripts/data/prepare_*.py).

Moses tokenization (sacremoses), joint BPE (subword-nmt), binarization
(fairseq-preprocess with a joined dictionary), plain-text file helpers, and
the path of a console script of this environment (the scripts that run
fairseq-train, fairseq-generate or the benchmark use it too).
The scripts import it as::

    from fairseq_aggressive.data_prep import common as prep_common

Errors (a missing module, a failing fairseq-preprocess) end the program with
``sys.exit("error: ...")``, like the scripts themselves.
"""

import collections
import functools
import importlib
import itertools
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

SPLITS = ("train", "valid", "test")

# Lines are handed to worker processes in blocks of this size, so that a lazy
# input (a 4.5M-line corpus) is never read into memory as a whole.
BLOCK = 20000


def require(module, hint):
    """Import `module` or exit with an explanation of what is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        sys.exit(f"error: Python module `{module}` is not available in {sys.executable}: {hint}")


# --------------------------------------------------------------------------
# Text files


def console_script(name):
    """A console script of this environment (fairseq-train, fairseq-aggressive-bench ...): the
    one beside this Python, even when its folder is not on PATH, else the PATH's."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def read_lines(path):
    """Lines of a UTF-8 file without their line ends (split on "\\n" only)."""
    return list(iter_lines(path))


def iter_lines(path):
    """Lazily yield the lines of a UTF-8 file without "\\n" (or "\\r\\n")."""
    with open(path, encoding="utf-8", newline="\n") as stream:
        for line in stream:
            yield line.rstrip("\n").rstrip("\r") if line.endswith("\n") else line


def write_lines(path, lines):
    """Write `lines` (any iterable of str) one a line; returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as stream:
        for line in lines:
            stream.write(line + "\n")
            count += 1
    return count


def split_file(split, side, kind=None):
    """``{split}.{side}`` or ``{split}.{kind}.{side}`` (kind: raw, tok)."""
    return ".".join(filter(None, (split, kind, side)))


def write_splits(out, splits, sides, kind=None):
    """``out/{split}[.{kind}].{side}`` from {split: [(side 0 text, side 1 text, ...)]}."""
    Path(out).mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        for i, side in enumerate(sides):
            write_lines(Path(out) / split_file(split, side, kind), [pair[i] for pair in pairs])


def map_splits(function, splits, sides):
    """{split: pairs} with ``function(lines, side)`` (a list of lines -> a list of
    lines) applied to each side of every split."""
    result = {}
    for split, pairs in splits.items():
        columns = [function([pair[i] for pair in pairs], side) for i, side in enumerate(sides)]
        result[split] = list(zip(*columns)) if pairs else []
    return result


def learn_and_apply_bpe(splits, sides, codes_path, operations):
    """Learn joint BPE codes on the train split's sides (interleaved pair by pair)
    and segment every split with them."""
    train_text = [text for pair in splits["train"] for text in pair[:len(sides)]]
    learn_bpe(train_text, codes_path, operations)
    return map_splits(lambda lines, side: apply_bpe(codes_path, lines), splits, sides)


# --------------------------------------------------------------------------
# Parallel map with bounded memory


def _blocks(items, size):
    iterator = iter(items)
    while True:
        block = list(itertools.islice(iterator, size))
        if not block:
            return
        yield block


def _pool_context():
    """Worker processes that start from a process without threads (a fork server, else a fresh
    interpreter), never a fork of the caller: a fork copies every lock another thread of the
    caller holds at that moment (a test runner's, a server's, torch's), locked for good in the
    child, and a worker that needs one waits forever."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # imported once by the server, not by every worker
    return context


def _map(function, items, workers, chunksize=500, initializer=None, initargs=()):
    """Lazily map `function` over `items` (in order), in `workers` processes (`function` and
    `initializer` picklable: module-level functions or partials of them)."""
    if workers <= 1:
        if initializer:
            initializer(*initargs)
        yield from map(function, items)
        return
    with _pool_context().Pool(workers, initializer, initargs) as pool:
        for block in _blocks(items, BLOCK):
            yield from pool.imap(function, block, chunksize=chunksize)
        pool.close()  # every result is in: the workers end by themselves before the pool goes
        pool.join()


# --------------------------------------------------------------------------
# Moses tokenization


_TOKENIZERS = {}


def _moses(lang):
    if lang not in _TOKENIZERS:
        sacremoses = require("sacremoses", "install it (pip install sacremoses)")
        _TOKENIZERS[lang] = sacremoses.MosesTokenizer(lang=lang)
    return _TOKENIZERS[lang]


def _tokenize_line(lang, escape, aggressive_dash_splits, protected_patterns, text):
    return _moses(lang).tokenize(text, aggressive_dash_splits=aggressive_dash_splits,
                                 escape=escape, return_str=True,
                                 protected_patterns=protected_patterns)


def tokenize_iter(lines, lang, workers=1, escape=False, aggressive_dash_splits=False,
                  protected_patterns=None):
    """Lazily Moses-tokenize `lines` (see ``tokenize``)."""
    require("sacremoses", "install it (pip install sacremoses)")
    function = functools.partial(_tokenize_line, lang, escape, aggressive_dash_splits,
                                 list(protected_patterns) if protected_patterns else None)
    return _map(function, lines, workers)


def tokenize(lines, lang, workers=1, escape=False, aggressive_dash_splits=False,
             protected_patterns=None):
    """Moses-tokenize every line with sacremoses; returns a list of strings.

    ``escape=False`` keeps ``& < > ' " [ ] |`` as they are (no ``&amp;``);
    ``aggressive_dash_splits`` is tokenizer.perl's ``-a`` (``a @-@ b``);
    ``protected_patterns`` are regexes whose matches stay single tokens.
    """
    return list(tokenize_iter(lines, lang, workers, escape, aggressive_dash_splits,
                              protected_patterns))


def detokenize(tokens_lines, lang, unescape=False):
    """Moses-detokenize whitespace-tokenized lines (e.g. ``tokenize`` output).

    ``unescape=False`` matches ``tokenize(..., escape=False)``: a literal
    ``&amp;`` in the text stays as it is.
    """
    sacremoses = require("sacremoses", "install it (pip install sacremoses)")
    detokenizer = sacremoses.MosesDetokenizer(lang=lang)
    return [detokenizer.detokenize(line.split(), return_str=True, unescape=unescape)
            for line in tokens_lines]


# --------------------------------------------------------------------------
# Joint BPE (subword-nmt)


def _bpe_modules():
    hint = "install subword-nmt (pip install subword-nmt)"
    return (require("subword_nmt.learn_bpe", hint), require("subword_nmt.apply_bpe", hint))


def _text_of(paths_or_lines):
    """Lines of a mix of files (os.PathLike items) and text lines (str items)."""
    for item in paths_or_lines:
        if isinstance(item, os.PathLike):
            yield from iter_lines(item)
        else:
            yield item


def learn_bpe(paths_or_lines, codes_path, operations, min_frequency=2):
    """Learn `operations` BPE merges on the given text into `codes_path`.

    `paths_or_lines` mixes files (``pathlib.Path`` items, read lazily) and text
    lines (``str`` items); for a joint BPE pass both sides' training text.
    """
    learn, _ = _bpe_modules()
    with open(codes_path, "w", encoding="utf-8") as codes:
        learn.learn_bpe(_text_of(paths_or_lines), codes, operations,
                        min_frequency=min_frequency)


_BPE = {}


def _load_bpe(codes_path):
    _, apply = _bpe_modules()
    with open(codes_path, encoding="utf-8") as codes:
        _BPE["bpe"] = apply.BPE(codes)


def _segment(line):
    return _BPE["bpe"].process_line(line)


def apply_bpe_iter(codes_path, lines, workers=1):
    """Lazily segment `lines` with the BPE codes in `codes_path`."""
    return _map(_segment, lines, workers, initializer=_load_bpe, initargs=(str(codes_path),))


def apply_bpe(codes_path, lines, workers=1):
    """Segment every line with the BPE codes in `codes_path` (``@@ `` joiners)."""
    return list(apply_bpe_iter(codes_path, lines, workers))


def remove_bpe(line):
    """Undo BPE segmentation (fairseq's ``--remove-bpe`` / ``subword_nmt``)."""
    return (line + " ").replace("@@ ", "").rstrip()


# --------------------------------------------------------------------------
# Binarization (fairseq-preprocess)


PREFIX_OPTION = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}


def preprocess_command(out_dir, src, tgt, workers, splits=SPLITS, destdir=None, dictionary=None):
    """The fairseq-preprocess command line used by ``binarize``.  Without
    ``dictionary`` a joined dictionary is learned on train; with it (a
    ``dict.*.txt`` file, e.g. a shipped model's) every split is binarized with it."""
    out_dir = Path(out_dir)
    unknown = [split for split in splits if split not in PREFIX_OPTION]
    if unknown or not splits or ("train" not in splits and dictionary is None):
        raise ValueError(f"splits must include train (or a dictionary be given) and be among "
                         f"{list(PREFIX_OPTION)}: {list(splits)}")
    command = [sys.executable, "-m", "fairseq_cli.preprocess",
               "--source-lang", src, "--target-lang", tgt]
    for split in SPLITS:
        if split in splits:
            command += [PREFIX_OPTION[split], str(out_dir / split)]
    command += ["--destdir", str(destdir or out_dir / "bin"),
                "--joined-dictionary", "--workers", str(workers)]
    if dictionary is not None:
        command += ["--srcdict", str(dictionary)]
    return command


def binarize(out_dir, src, tgt, workers, splits=SPLITS, destdir=None, verbose=False,
             dictionary=None):
    """Binarize ``out_dir/{split}.{src,tgt}`` into ``out_dir/bin`` (or `destdir`).

    Runs ``python -m fairseq_cli.preprocess`` with a joined dictionary.  A
    stale destination folder is removed first (fairseq-preprocess refuses to
    overwrite its dictionaries).  ``verbose`` prints the command and passes
    fairseq's log (stderr) through; otherwise it is only shown on failure,
    which ends the program with the last lines of that log.
    """
    command = preprocess_command(out_dir, src, tgt, workers, splits, destdir, dictionary)
    target = Path(command[command.index("--destdir") + 1])
    missing = [f"{Path(out_dir) / split}.{lang}" for split in splits for lang in (src, tgt)
               if not Path(f"{Path(out_dir) / split}.{lang}").is_file()]
    if missing:
        sys.exit("error: cannot binarize, missing input files: " + ", ".join(missing))
    if target.exists():
        shutil.rmtree(target)
    if verbose:
        print("Running", " ".join(command))
    tail = collections.deque(maxlen=15)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, encoding="utf-8", errors="replace") as process:
        for line in process.stderr:
            tail.append(line.rstrip("\n"))
            if verbose:
                sys.stderr.write(line)
                sys.stderr.flush()
    if process.returncode:
        sys.exit(f"error: fairseq-preprocess failed with exit code {process.returncode}:\n"
                 + "\n".join(tail))
    return target


# --------------------------------------------------------------------------
# WMT-style normalisation (before tokenization)


_NORMALIZERS = {}


def _punct_normalizer(lang):
    if lang not in _NORMALIZERS:
        sacremoses = require("sacremoses", "install it (pip install sacremoses)")
        _NORMALIZERS[lang] = sacremoses.MosesPunctNormalizer(lang=lang)
    return _NORMALIZERS[lang]


_OTHER_CHAR = None


def remove_non_printing(text):
    """Moses remove-non-printing-char.perl: Unicode "other" characters -> space."""
    global _OTHER_CHAR
    if _OTHER_CHAR is None:
        _OTHER_CHAR = require("regex", "install it (pip install regex)").compile(r"\p{C}")
    return _OTHER_CHAR.sub(" ", text)


# Romanian: s/t with cedilla (legacy encodings) -> with comma below, as in
# WMT16 normalise-romanian.py; remove-diacritics.py then maps ă â î ș ț to ASCII.
ROMANIAN_COMMA = str.maketrans("\u015e\u015f\u0162\u0163", "\u0218\u0219\u021a\u021b")
ROMANIAN_ASCII = str.maketrans("\u0218\u0219\u021a\u021b\u0102\u0103\u00c2\u00e2\u00ce\u00ee",
                               "SsTtAaAaIi")


def normalize_wmt(text, lang, remove_diacritics=False):
    """Moses normalize-punctuation.perl (-l lang) + remove-non-printing-char.perl,
    then for Romanian the comma-below normalisation (and optionally no diacritics)."""
    text = remove_non_printing(_punct_normalizer(lang).normalize(text))
    if lang == "ro":
        text = text.translate(ROMANIAN_COMMA)
        if remove_diacritics:
            text = text.translate(ROMANIAN_ASCII)
    return " ".join(text.split())


def _normalize_and_tokenize(lang, remove_diacritics, escape, aggressive_dash_splits, text):
    return _tokenize_line(lang, escape, aggressive_dash_splits, None,
                          normalize_wmt(text, lang, remove_diacritics))


def normalize_tokenize_iter(lines, lang, workers=1, remove_diacritics=False, escape=False,
                            aggressive_dash_splits=True):
    """Lazily ``normalize_wmt`` then Moses-tokenize (``-a`` by default) `lines`."""
    require("sacremoses", "install it (pip install sacremoses)")
    function = functools.partial(_normalize_and_tokenize, lang, remove_diacritics, escape,
                                 aggressive_dash_splits)
    return _map(function, lines, workers)
