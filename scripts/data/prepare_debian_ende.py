#!/usr/bin/env python
"""Build an English-German parallel corpus offline from Debian packages.

Every text comes from a Debian package fetched with ``apt-get download`` (no
root, nothing installed); the .deb files are read with ``dpkg-deb
--fsys-tarfile`` (or, without dpkg-deb, by unpacking the ar archive in Python),
so nothing is extracted to disk.  Sources (``--sources``, default all):

``ding``
    The Ding dictionary (``trans-de-en``): lines ``German :: English`` whose
    ``|``-separated parts correspond one to one.  Only parts that look like
    full sentences on both sides are used (capitalised, ending in . ! ? or …,
    no ``sb./jdn.`` placeholders, no ``a/b`` alternatives); of ``;``-separated
    alternatives the first is taken.
``lo-help``
    LibreOffice help (``libreoffice-help-en-us`` + ``libreoffice-help-de``,
    HTML pages): paragraphs and headings with the same ``par_id``/``hd_id`` in
    the same page are paired.
``wesnoth``
    The German gettext catalogues (.mo) of Battle for Wesnoth: the data package
    and every campaign package of the newest branch apt knows.
``gimp-help``
    The GIMP manual (``gimp-help-en`` + ``gimp-help-de``, HTML pages built from
    one DocBook source): ``<p>`` paragraphs paired by position in the same
    page; pages whose paragraph counts differ are skipped.
``games``, ``apps``, ``tech``
    German .mo catalogues of Freeciv and Widelands; of LibreOffice's user
    interface, GIMP, Inkscape, GnuCash, calibre, Blender, digiKam, Gramps,
    Evolution, darktable, Gnumeric and LyX; of PostgreSQL, Git, GCC and
    coreutils (see ``all_sources``).

For .mo catalogues msgid (English) -> msgstr (German); contexts are dropped,
plural entries give their singular forms, messages whose blank-line separated
paragraphs correspond are split into them, markup (Pango, Wesnoth help tags)
is removed, and messages with format placeholders (%s, $var, {0}, ...) are
skipped.

Cleaning: whitespace normalised; pairs kept when both sides have 4-60 words,
the word and character length ratios are <= 2 and the sides differ (and less
than 60% of the German words occur in the English side); duplicate
sources and duplicate targets (compared lowercased, letters and digits only)
are dropped, so no valid/test source or target occurs in train.  The pairs are
shuffled with ``--seed`` and split into test, valid and train.

Output in ``--out`` (built in a temporary directory and moved in at the end):
``{split}.raw.{en,de}`` (untokenized, for sacrebleu), ``{split}.origin`` (the
source of every pair: ``ding``, ``lo-help``, ``apps/gimp-data``, ...), ``{split}.tok.{en,de}`` (Moses-tokenized),
``bpe.codes`` and ``{split}.{en,de}`` (joint BPE), ``bin/`` (fairseq-preprocess,
joined dictionary), ``packages.tsv`` (the .deb files used) and
``licences/PKG.copyright``.

The code: this file is the command line; in ``fairseq_aggressive/data_prep/``,
``debian_text.py`` cleans, pairs, filters and splits the texts,
``debian_packages.py`` downloads and reads .deb files, ``debian_sources.py``
lists the sources and their readers.

Examples::

    python scripts/data/prepare_debian_ende.py --out work/ende
    python scripts/data/prepare_debian_ende.py --out /tmp/small --sources ding,wesnoth \\
        --max-pairs 20000 --bpe-ops 4000 --no-binarize
"""

import argparse
import collections
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from fairseq_aggressive.data_prep import common as prep_common
from fairseq_aggressive.data_prep.common import require, write_lines
from fairseq_aggressive.data_prep.debian_packages import download, package_version
from fairseq_aggressive.data_prep.debian_sources import all_sources
from fairseq_aggressive.data_prep.debian_text import clean_corpus, split_corpus

SPLITS = prep_common.SPLITS
LANGS = ("en", "de")


# --------------------------------------------------------------------------
# Command line


def parse_args(argv=None, source_names=()):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the sources, cleaning and outputs.")
    parser.add_argument("--out", required=True, type=Path,
                        help="output directory (text files, bpe.codes and bin/)")
    parser.add_argument("--cache", type=Path,
                        help="folder for the downloaded .deb files, reused when present "
                             "(default: OUT/debs)")
    parser.add_argument("--sources", default=",".join(source_names),
                        help="comma-separated sources to use (default: %(default)s)")
    parser.add_argument("--valid-size", type=int, default=1500,
                        help="validation pairs (default: %(default)s)")
    parser.add_argument("--test-size", type=int, default=2000,
                        help="test pairs (default: %(default)s)")
    parser.add_argument("--max-pairs", type=int,
                        help="keep at most this many pairs in total (after shuffling)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the shuffle before splitting (default: %(default)s)")
    parser.add_argument("--bpe-ops", type=int, default=10000,
                        help="number of joint BPE merge operations (default: %(default)s)")
    parser.add_argument("--from-model", type=Path, metavar="DIR",
                        help="segment and binarize with a model's bpe.codes and joined dictionary "
                             "(dict.en.txt) instead of learning them, so that the model (a shipped "
                             "one: models/ende-teacher-6x6) reads this corpus")
    parser.add_argument("--no-binarize", action="store_true",
                        help="stop after writing the BPE text files")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes for tokenization and fairseq-preprocess "
                             "(default: %(default)s)")
    parser.add_argument("--examples", type=int, default=3,
                        help="sample pairs to print per source (default: %(default)s)")
    args = parser.parse_args(argv)
    args.sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = sorted(set(args.sources) - set(source_names))
    if unknown or not args.sources:
        parser.error(f"unknown or no --sources {','.join(unknown)}; "
                     f"choose from {','.join(source_names)}")
    if args.cache is None:
        args.cache = args.out / "debs"
    if args.from_model is not None:
        files = [args.from_model / n for n in ("bpe.codes", "dict.en.txt", "dict.de.txt")]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            parser.error(f"--from-model {args.from_model}: missing {', '.join(missing)}")
        if files[1].read_bytes() != files[2].read_bytes():
            parser.error(f"--from-model {args.from_model}: its dict.en.txt and dict.de.txt differ "
                         "(this corpus is binarized with one joined dictionary)")
    return args


# --------------------------------------------------------------------------
# Text files, tokenization, BPE, binarization


def tokenize_splits(splits, workers):
    return prep_common.map_splits(lambda lines, lang: prep_common.tokenize(
        lines, lang, workers=workers, escape=False), splits, LANGS)


def binarize(out, workers, dictionary=None):
    """Run fairseq-preprocess on ``out/{split}.{en,de}`` into ``out/bin`` (with ``dictionary``
    where given, else a joined dictionary learned on train)."""
    print("Running fairseq-preprocess")
    prep_common.binarize(out, "en", "de", workers, dictionary=dictionary)


def publish(staging, out):
    """Move the finished files from `staging` into `out`, replacing older ones."""
    for item in sorted(staging.iterdir()):
        target = out / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        item.rename(target)


# --------------------------------------------------------------------------


def collect(sources, cache):
    """Download the sources' packages and read {source: [(en, de)]}, licences, packages."""
    packages = {s.name: (s.packages() if callable(s.packages) else s.packages)
                for s in sources}
    debs = download([p for names in packages.values() for p in names], cache)
    raw, licences = collections.OrderedDict(), {}
    for source in sources:
        started = time.time()
        print(f"  {source.name} ({source.description}), {len(packages[source.name])} package(s)")
        raw[source.name] = source.reader({p: debs[p] for p in packages[source.name]}, licences)
        print(f"    -> {len(raw[source.name])} candidate pairs ({time.time() - started:.0f}s)")
    used = [(source, p, debs[p]) for source, names in packages.items() for p in names]
    return raw, licences, used


def print_report(stats, splits, examples):
    by_package = collections.defaultdict(collections.Counter)
    for pairs in splits.values():
        for _, _, origin in pairs:
            source, _, package = origin.partition("/")
            if package and source != "wesnoth":
                by_package[source][package] += 1
    print("Per source (after the filters and deduplication, in this order):")
    for source, counter in stats.items():
        drops = ", ".join(f"{k[len('dropped: '):]} {v}" for k, v in sorted(counter.items())
                          if k.startswith("dropped: "))
        print(f"  {source:9s} extracted {counter['extracted']:7d}  kept {counter['kept']:7d}"
              f"  (dropped: {drops or 'none'})")
        if by_package[source]:
            print("            kept per package: " + ", ".join(
                f"{package} {n}" for package, n in by_package[source].most_common()))
    print("Per split:")
    for split in SPLITS:
        pairs = splits[split]
        by_source = collections.Counter(origin.split("/")[0] for _, _, origin in pairs)
        words = sum(len(en.split()) for en, _, _ in pairs)
        print(f"  {split:5s} {len(pairs):7d} pairs, {words / max(len(pairs), 1):.1f} English "
              f"words/pair; " + ", ".join(f"{s} {n}" for s, n in sorted(by_source.items())))
    if examples:
        print("Sample valid pairs:")
        for source in stats:
            for en, de, _ in [p for p in splits["valid"]
                              if p[2].split("/")[0] == source][:examples]:
                print(f"  [{source}] en: {en}\n  {' ' * (len(source) + 2)} de: {de}")


def main(argv=None):
    started = time.time()
    # Let `kill` unwind normally, so that the temporary build folder is removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    source_names = [s.name for s in all_sources(None)]
    args = parse_args(argv, source_names)
    sources = [s for s in all_sources(args.cache) if s.name in args.sources]
    for module, hint in (("sacremoses", "pip install sacremoses"),
                         ("subword_nmt", "pip install subword-nmt")):
        require(module, hint)
    if not args.no_binarize:
        require("fairseq_cli.preprocess", "install fairseq, or use --no-binarize")

    print(f"Reading {len(sources)} sources")
    raw, licences, used = collect(sources, args.cache)
    pairs, stats = clean_corpus(raw)
    try:
        splits = split_corpus(pairs, args.valid_size, args.test_size, args.seed, args.max_pairs)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print_report(stats, splits, args.examples)

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out, prefix=".build-") as scratch:
        staging = Path(scratch)
        prep_common.write_splits(staging, splits, LANGS, "raw")
        for split, split_pairs in splits.items():
            write_lines(staging / f"{split}.origin", [source for _, _, source in split_pairs])
        write_lines(staging / "packages.tsv", ["source\tpackage\tversion\tdeb"] + [
            f"{source}\t{package}\t{package_version(deb)}\t{deb.name}"
            for source, package, deb in used])
        (staging / "licences").mkdir()
        for package, data in sorted(licences.items()):
            (staging / "licences" / f"{package}.copyright").write_bytes(data)

        step = time.time()
        tokenized = tokenize_splits(splits, args.workers)
        prep_common.write_splits(staging, tokenized, LANGS, "tok")
        took, step = time.time() - step, time.time()
        if args.from_model is not None:
            print(f"Tokenized ({took:.0f}s); segmenting with {args.from_model / 'bpe.codes'}")
            shutil.copyfile(args.from_model / "bpe.codes", staging / "bpe.codes")
            segmented = prep_common.map_splits(
                lambda lines, lang: prep_common.apply_bpe(staging / "bpe.codes", lines), tokenized, LANGS)
        else:
            print(f"Tokenized ({took:.0f}s); learning {args.bpe_ops} joint BPE operations")
            segmented = prep_common.learn_and_apply_bpe(tokenized, LANGS, staging / "bpe.codes", args.bpe_ops)
        prep_common.write_splits(staging, segmented, LANGS)
        print(f"BPE done ({time.time() - step:.0f}s)")
        if not args.no_binarize:
            step = time.time()
            binarize(staging, args.workers, args.from_model / "dict.en.txt" if args.from_model else None)
            print(f"Binarized ({time.time() - step:.0f}s)")
        publish(staging, args.out)
    stale = args.out / "bin"
    if args.no_binarize and stale.is_dir():  # from an earlier run: no longer matches the text
        shutil.rmtree(stale)
        print(f"Removed the outdated {stale}")
    print(f"Done in {time.time() - started:.0f}s; output in {args.out}")


if __name__ == "__main__":
    main()
