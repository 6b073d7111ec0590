#!/usr/bin/env python
"""Prepare WMT14 English-German or WMT16 English-Romanian for fairseq.

The standard benchmark data of the aggressive-decoding papers, for a machine
with network access and GPUs (the full corpora are large: WMT14 en-de has
~4.5M training pairs, several GB of text and hours of CPU time to tokenize).

``--pair wmt14-en-de``
    train: Europarl v7 + Common Crawl + News Commentary v9 (de-en);
    valid: newstest2013; test: newstest2014, the "full" version (3003
    sentences, ``test-full.tgz``), as fairseq's
    examples/translation/prepare-wmt14en2de.sh.  BPE: 32000 joint merges.
``--pair wmt16-en-ro``
    train: Europarl v8 (ro-en) + SETIMES2 (OPUS); valid: newsdev2016;
    test: newstest2016.  BPE: 40000 joint merges, the setting of the
    non-autoregressive / aggressive-decoding literature on WMT16 en-ro
    (Lee et al. 2018, Ghazvininejad et al. 2019); pass --bpe-ops to change it.

Pipeline (our own Python; the facts follow the Moses/fairseq recipes):

1. Download the archives from statmt.org / OPUS (``--raw-dir`` skips this and
   reads already downloaded archives or extracted files from DIR; files are
   found by name anywhere below DIR) and extract them.
2. SGM test sets: the text of the ``<seg ...>`` lines, spaces squeezed
   (entities are left as they are, like sacreBLEU's own SGM reader).
3. Normalise (Moses normalize-punctuation.perl and remove-non-printing-char
   via sacremoses; Romanian: s/t with cedilla -> comma below, as WMT16's
   normalise-romanian.py; ``--ro-remove-diacritics`` also removes ă â î ș ț
   on the Romanian side, as remove-diacritics.py, off by default), then
   Moses-tokenize with aggressive dash splitting (tokenizer.perl ``-a``) and
   without escaping (``&`` stays ``&``, not ``&amp;``).
4. Learn a joint BPE on train (both languages) with subword-nmt; apply it to
   every split.
5. Clean train and valid like clean-corpus-n.perl ``-ratio 1.5 ... 1 250`` on
   the BPE text: drop a pair if a side has 0 or more than 250 tokens or one
   side has more than 1.5 times the tokens of the other.  test is not cleaned.
6. Binarize with fairseq-preprocess, joined dictionary, ``--source-lang en
   --target-lang de|ro``.

Output in ``--out DIR``: ``{train,valid,test}.{en,de|ro}`` (BPE text),
``{split}.tok.{lang}`` (tokenized, aligned with the BPE files),
``test.raw.{lang}`` (the untokenized test set) and ``test.detok.{tgt}`` (the
reference for sacreBLEU: the original newstest sentences), ``bpe.codes``,
``bin/``.  Downloads go to ``DIR/orig`` unless ``--raw-dir`` is given.

The other direction (de->en, ro->en) needs no second preparation: the
dictionary is joined, so train and decode on the same ``bin/`` with
``--source-lang de --target-lang en`` (fairseq finds ``train.en-de.*`` for
either order); the sacreBLEU reference is then ``test.raw.en``.

Examples::

    python scripts/data/prepare_wmt.py --pair wmt14-en-de --out data-bin/wmt14_en_de --workers 8
    python scripts/data/prepare_wmt.py --pair wmt16-en-ro --out /tmp/enro --download-only
    python scripts/data/prepare_wmt.py --pair wmt16-en-ro --out /tmp/enro-small \\
        --raw-dir /tmp/enro/orig --max-train-pairs 100000 --bpe-ops 8000
"""

import argparse
import os
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from fairseq_aggressive.data_prep import common as prep_common

SPLITS = prep_common.SPLITS
MAX_TOKENS, MAX_RATIO = 250, 1.5

# For every file: alternative (source name, target name) pairs, the first
# found is used.  Names are base names, looked up anywhere below the raw folder.
PAIRS = {
    "wmt14-en-de": {
        "src": "en", "tgt": "de", "bpe_ops": 32000,
        "archives": {
            "training-parallel-europarl-v7.tgz":
                "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
            "training-parallel-commoncrawl.tgz":
                "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
            "training-parallel-nc-v9.tgz":
                "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
            "dev.tgz": "https://data.statmt.org/wmt17/translation-task/dev.tgz",
            "test-full.tgz": "https://www.statmt.org/wmt14/test-full.tgz",
        },
        "train": {
            "europarl-v7": [("europarl-v7.de-en.en", "europarl-v7.de-en.de")],
            "commoncrawl": [("commoncrawl.de-en.en", "commoncrawl.de-en.de")],
            "news-commentary-v9": [("news-commentary-v9.de-en.en",
                                    "news-commentary-v9.de-en.de")],
        },
        "valid": [("newstest2013.en", "newstest2013.de"),
                  ("newstest2013-src.en.sgm", "newstest2013-ref.de.sgm")],
        "test": [("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm")],
    },
    "wmt16-en-ro": {
        "src": "en", "tgt": "ro", "bpe_ops": 40000,
        "archives": {
            "training-parallel-ep-v8.tgz":
                "https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz",
            "en-ro.txt.zip": "https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip",
            "dev-romanian-updated.tgz":
                "https://data.statmt.org/wmt16/translation-task/dev-romanian-updated.tgz",
            "test.tgz": "https://data.statmt.org/wmt16/translation-task/test.tgz",
        },
        "train": {
            "europarl-v8": [("europarl-v8.ro-en.en", "europarl-v8.ro-en.ro")],
            "setimes2": [("SETIMES.en-ro.en", "SETIMES.en-ro.ro"),
                         ("SETIMES2.en-ro.en", "SETIMES2.en-ro.ro")],
        },
        "valid": [("newsdev2016-enro-src.en.sgm", "newsdev2016-enro-ref.ro.sgm"),
                  ("newsdev2016-roen-ref.en.sgm", "newsdev2016-roen-src.ro.sgm")],
        "test": [("newstest2016-enro-src.en.sgm", "newstest2016-enro-ref.ro.sgm"),
                 ("newstest2016-roen-ref.en.sgm", "newstest2016-roen-src.ro.sgm")],
    },
}


# --------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the sources, URLs, cleaning and outputs.")
    parser.add_argument("--pair", required=True, choices=sorted(PAIRS))
    parser.add_argument("--out", required=True, type=Path,
                        help="output directory (text files, bpe.codes and bin/)")
    parser.add_argument("--raw-dir", type=Path,
                        help="read already downloaded archives or extracted files from this "
                             "folder instead of downloading (default: download into OUT/orig)")
    parser.add_argument("--bpe-ops", type=int,
                        help="joint BPE merge operations (default: 32000 for wmt14-en-de, "
                             "40000 for wmt16-en-ro)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes for tokenization, BPE and fairseq-preprocess "
                             "(default: %(default)s)")
    parser.add_argument("--max-train-pairs", type=int, metavar="N",
                        help="use only the first N training pairs (corpora in the order "
                             "listed in the docstring), for small trials")
    parser.add_argument("--download-only", action="store_true",
                        help="download and extract the archives, then stop")
    parser.add_argument("--ro-remove-diacritics", action="store_true",
                        help="wmt16-en-ro: also remove diacritics on the Romanian side "
                             "(the references in test.detok.ro keep theirs)")
    parser.add_argument("--no-binarize", action="store_true",
                        help="stop after writing the BPE text files")
    args = parser.parse_args(argv)
    if args.bpe_ops is None:
        args.bpe_ops = PAIRS[args.pair]["bpe_ops"]
    if args.max_train_pairs is not None and args.max_train_pairs < 1:
        parser.error("--max-train-pairs must be positive")
    return args


# --------------------------------------------------------------------------
# Download and extraction


def download(url, dest):
    """Download `url` to `dest`; resumes a partial ``dest.part``.  Progress on stderr."""
    part = dest.with_name(dest.name + ".part")
    done = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fairseq-aggressive-prep"})
    if done:
        request.add_header("Range", f"bytes={done}-")
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        if error.code == 416 and done:  # the partial file is already complete
            part.rename(dest)
            return
        sys.exit(f"error: downloading {url} failed: {error}")
    except (urllib.error.URLError, OSError) as error:
        sys.exit(f"error: downloading {url} failed: {error}; without network, download it "
                 "elsewhere and pass its folder with --raw-dir")
    with response:
        if done and response.status != 206:  # the server ignored the range: start over
            done = 0
        total = response.headers.get("Content-Length")
        total = int(total) + done if total else None
        shown = 0.0
        with open(part, "ab" if done else "wb") as stream:
            while True:
                block = response.read(1 << 20)
                if not block:
                    break
                stream.write(block)
                done += len(block)
                if time.time() - shown > 1:
                    shown = time.time()
                    size = f"/{total / 1e6:.0f}" if total else ""
                    sys.stderr.write(f"\r  {dest.name}: {done / 1e6:.0f}{size} MB")
                    sys.stderr.flush()
    sys.stderr.write(f"\r  {dest.name}: {done / 1e6:.0f} MB, done\n")
    if total and done != total:
        sys.exit(f"error: {url}: got {done} of {total} bytes; run again to resume")
    part.rename(dest)


def extract(archive, folder):
    """Extract a .tgz/.zip into `folder` (zip files into a folder of their own name)."""
    stamp = folder / f".extracted-{archive.name}"
    if stamp.exists():
        return
    print(f"  extracting {archive.name}")
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(folder / archive.name[:-len(".zip")])
    else:
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(folder, filter="data")
            except TypeError:  # Python without extraction filters
                tar.extractall(folder)
    stamp.touch()


def fetch(spec, folder):
    """Download (what is missing) and extract every archive of `spec` into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, url in spec["archives"].items():
        archive = folder / name
        if not archive.exists():
            print(f"Downloading {url}")
            download(url, archive)
        extract(archive, folder)


class RawFiles:
    """Finds files by base name below a folder (extracting archives found there)."""

    def __init__(self, folder, spec):
        self.folder, self.spec = folder, spec
        self.index = None

    def _scan(self):
        self.index = {}
        for path in sorted(self.folder.rglob("*")):
            if path.is_file():
                self.index.setdefault(path.name, path)

    def find(self, alternatives):
        """The first (src path, tgt path) of `alternatives` that exists, or None."""
        if self.index is None:
            self._scan()
        for attempt in range(2):
            for src, tgt in alternatives:
                if src in self.index and tgt in self.index:
                    return self.index[src], self.index[tgt]
            archives = [self.folder / n for n in self.spec["archives"]
                        if (self.folder / n).is_file()
                        and not (self.folder / f".extracted-{n}").exists()]
            if attempt or not archives:
                return None
            for archive in archives:
                extract(archive, self.folder)
            self._scan()
        return None

    def require(self, alternatives, what):
        found = self.find(alternatives)
        if found is None:
            names = " or ".join(f"{s} + {t}" for s, t in alternatives)
            sys.exit(f"error: {what}: found no {names} below {self.folder}; the archives are "
                     + ", ".join(self.spec["archives"].values()))
        return found


# --------------------------------------------------------------------------
# Reading


SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.I)


def read_sgm(path):
    """Sentences of an SGM file: the <seg> contents, whitespace squeezed."""
    return [" ".join(match.group(1).split())
            for match in map(SEG.search, prep_common.iter_lines(path)) if match]


def read_text(path):
    return read_sgm(path) if path.name.endswith(".sgm") else prep_common.read_lines(path)


def take(lines, limit):
    for i, line in enumerate(lines):
        if limit is not None and i >= limit:
            return
        yield line


# --------------------------------------------------------------------------
# Steps


class Prep:
    def __init__(self, args, spec, out):
        self.args, self.spec, self.out = args, spec, out
        self.langs = (spec["src"], spec["tgt"])
        self.tmp = out / ".tmp"

    def tokenize(self, lines, lang):
        return prep_common.normalize_tokenize_iter(
            lines, lang, workers=self.args.workers,
            remove_diacritics=self.args.ro_remove_diacritics and lang == "ro")

    def tokenize_train(self, corpora):
        """Write tmp/train.tok.{lang} from the training corpora; check alignment."""
        counts = {}
        for lang_index, lang in enumerate(self.langs):
            remaining = self.args.max_train_pairs

            def lines():
                nonlocal remaining
                for name, paths in corpora.items():
                    count = 0
                    if remaining is not None and remaining <= 0:
                        counts[name, lang] = 0
                        continue
                    for line in take(prep_common.iter_lines(paths[lang_index]), remaining):
                        count += 1
                        yield line
                    counts[name, lang] = count
                    if remaining is not None:
                        remaining -= count
            started = time.time()
            n = prep_common.write_lines(self.tmp / f"train.tok.{lang}",
                                        self.tokenize(lines(), lang))
            print(f"  train.tok.{lang}: {n} lines ({time.time() - started:.0f}s)")
        for name in corpora:
            sizes = [counts[name, lang] for lang in self.langs]
            if sizes[0] != sizes[1]:
                sys.exit(f"error: corpus {name}: {sizes[0]} {self.langs[0]} lines but "
                         f"{sizes[1]} {self.langs[1]} lines: {corpora[name]}")
            print(f"    {name}: {sizes[0]} pairs")

    def tokenize_eval(self, split, paths):
        sentences = [read_text(path) for path in paths]
        if len(sentences[0]) != len(sentences[1]):
            sys.exit(f"error: {split}: {len(sentences[0])} source but {len(sentences[1])} "
                     f"target sentences in {paths[0]} and {paths[1]}")
        for lang, lines in zip(self.langs, sentences):
            if split == "test":
                prep_common.write_lines(self.out / f"test.raw.{lang}", lines)
            prep_common.write_lines(self.tmp / f"{split}.tok.{lang}", self.tokenize(lines, lang))
        if split == "test":
            prep_common.write_lines(self.out / f"test.detok.{self.langs[1]}", sentences[1])
        print(f"  {split}: {len(sentences[0])} pairs from {paths[0].name}, {paths[1].name}")

    def bpe_and_clean(self, split):
        """tmp/{split}.tok.* -> {split}.{lang} and {split}.tok.{lang} (cleaned)."""
        codes = self.out / "bpe.codes"
        for lang in self.langs:
            prep_common.write_lines(
                self.tmp / f"{split}.bpe.{lang}",
                prep_common.apply_bpe_iter(codes, prep_common.iter_lines(
                    self.tmp / f"{split}.tok.{lang}"), self.args.workers))
        inputs = [prep_common.iter_lines(self.tmp / f"{split}.{kind}.{lang}")
                  for kind in ("bpe", "tok") for lang in self.langs]
        names = [f"{split}.{lang}" for lang in self.langs] + \
                [f"{split}.tok.{lang}" for lang in self.langs]
        streams = [open(self.out / name, "w", encoding="utf-8", newline="\n") for name in names]
        kept = dropped = 0
        try:
            for lines in zip(*inputs):
                if split != "test" and not keep_pair(lines[0], lines[1]):
                    dropped += 1
                    continue
                kept += 1
                for stream, line in zip(streams, lines):
                    stream.write(line + "\n")
        finally:
            for stream in streams:
                stream.close()
        print(f"  {split}: {kept} pairs" + (f" ({dropped} dropped by the length/ratio "
                                             "filter)" if split != "test" else ""))


def keep_pair(src, tgt, max_tokens=MAX_TOKENS, ratio=MAX_RATIO):
    """clean-corpus-n.perl ``-ratio 1.5 ... 1 250`` on whitespace tokens."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if not 1 <= n_src <= max_tokens or not 1 <= n_tgt <= max_tokens:
        return False
    return n_src <= ratio * n_tgt and n_tgt <= ratio * n_src


def main(argv=None):
    args = parse_args(argv)
    spec = PAIRS[args.pair]
    started = time.time()
    raw_dir = args.raw_dir or args.out / "orig"
    if args.download_only or args.raw_dir is None:
        print(f"Fetching {args.pair} into {raw_dir}")
        fetch(spec, raw_dir)
        if args.download_only:
            print(f"Done in {time.time() - started:.0f}s; archives in {raw_dir}")
            return
    elif not raw_dir.is_dir():
        sys.exit(f"error: --raw-dir {raw_dir} is not a folder")
    for module, hint in (("sacremoses", "pip install sacremoses"),
                         ("subword_nmt", "pip install subword-nmt")):
        prep_common.require(module, hint)

    raw = RawFiles(raw_dir, spec)
    corpora = {name: raw.require(alternatives, f"training corpus {name}")
               for name, alternatives in spec["train"].items()}
    evaluation = {split: raw.require(spec[split], f"{split} set") for split in ("valid", "test")}

    out = args.out
    prep = Prep(args, spec, out)
    if prep.tmp.exists():
        shutil.rmtree(prep.tmp)
    prep.tmp.mkdir(parents=True)
    src, tgt = prep.langs
    print(f"Normalising and tokenizing ({args.workers} workers)")
    prep.tokenize_train(corpora)
    for split, paths in evaluation.items():
        prep.tokenize_eval(split, paths)

    step = time.time()
    print(f"Learning {args.bpe_ops} joint BPE operations on train.tok.{src} + train.tok.{tgt}")
    prep_common.learn_bpe([prep.tmp / f"train.tok.{lang}" for lang in prep.langs],
                          out / "bpe.codes", args.bpe_ops)
    print(f"  ({time.time() - step:.0f}s); applying BPE and cleaning "
          f"(1-{MAX_TOKENS} tokens, ratio <= {MAX_RATIO})")
    for split in SPLITS:
        prep.bpe_and_clean(split)
    shutil.rmtree(prep.tmp)

    if args.no_binarize:
        stale = out / "bin"
        if stale.is_dir():  # from an earlier run: no longer matches the text
            shutil.rmtree(stale)
    else:
        print("Running fairseq-preprocess")
        prep_common.binarize(out, src, tgt, args.workers)
    print(f"Done in {time.time() - started:.0f}s; output in {out}")


if __name__ == "__main__":
    main()
