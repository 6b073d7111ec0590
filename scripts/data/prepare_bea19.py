#!/usr/bin/env python
"""Prepare the BEA-2019 restricted GEC setting from M2 files you provide.

The corpora are licensed and not downloaded here: pass the M2 files of the
BEA-2019 shared task release (the ERRANT-annotated versions):

``--lang8``, ``--nucle``, ``--fce``, ``--wi-train`` (each one or more M2 files)
    training data: e.g. lang8.train.auto.bea19.m2, nucle.train.gold.bea19.m2,
    fce.{train,dev,test}.gold.bea19.m2, ABC.train.gold.bea19.m2.  At least one
    training file is required.
``--conll13`` -> valid (``--wi-dev`` when there is no CoNLL-13)
``--conll14`` -> test (official CoNLL-2014 test M2, e.g. official-2014.combined.m2)
``--wi-dev``  -> W&I+LOCNESS dev (ABCN.dev.gold.bea19.m2): the valid split
    without --conll13, else written as the extra split ``wi_dev``.

Every M2 sentence becomes a pair (source = its ``S`` line, target = the
source with the edits of annotator ``--annotator`` (default 0, the first)
applied; ``noop`` edits and other annotators are ignored; a ``-NONE-``
correction deletes the span).  The text is already tokenized, so it is not
re-tokenized.  Training pairs with an empty side are dropped; unchanged pairs
are kept (as in the usual pipelines) unless ``--drop-unchanged``.  valid,
test and wi_dev keep every sentence, in M2 order, so that hypotheses align
with the gold M2.

Output in ``--out DIR``: ``{split}.tok.{src,tgt}`` (the tokenized text;
``{split}.tok.src`` is what the M2 scorer expects hypotheses to align with),
``bpe.codes`` (joint BPE learned on train, ``--bpe-ops``), ``{split}.{src,tgt}``
(BPE text), ``gold/{conll13,conll14,wi_dev}.m2`` (copies of the given gold
files), ``bin/`` (fairseq-preprocess, joined dictionary, splits train and
those of valid/test that exist) and ``splits.txt`` (what each split holds and
which are missing).

Example::

    python scripts/data/prepare_bea19.py --lang8 lang8.train.auto.bea19.m2 \\
        --nucle nucle.train.gold.bea19.m2 --fce fce.*.gold.bea19.m2 \\
        --wi-train ABC.train.gold.bea19.m2 --wi-dev ABCN.dev.gold.bea19.m2 \\
        --conll13 official-2013.combined.m2 --conll14 official-2014.combined.m2 \\
        --out data-bin/bea19
"""

import argparse
import collections
import shutil
import sys
import time
from pathlib import Path

from fairseq_aggressive.data_prep import common as prep_common

TRAIN_SOURCES = ("lang8", "nucle", "fce", "wi_train")


# --------------------------------------------------------------------------
# M2 reading


def m2_pairs(path, annotator=0):
    """[(source, target)] tokenized text of an M2 file: the source with
    `annotator`'s edits applied (the first alternative of an ``a||b``
    correction), read by the M2 scorer's own reader
    (:mod:`fairseq_aggressive.evaluation.m2`, which checks spans)."""
    from fairseq_aggressive.evaluation.m2 import apply_edits, parse_m2

    try:
        sentences = parse_m2(prep_common.iter_lines(path))
        return [(" ".join(s.source), " ".join(apply_edits(s.source, s.edits.get(annotator, []))))
                for s in sentences]
    except ValueError as error:  # M2FormatError, overlapping edits
        sys.exit(f"error: {path}: {error}")


# --------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the splits and outputs.")
    for name, what in (("lang8", "Lang-8 (BEA-19 release)"), ("nucle", "NUCLE"),
                       ("fce", "FCE"), ("wi-train", "W&I+LOCNESS train")):
        parser.add_argument(f"--{name}", nargs="+", type=Path, default=[], metavar="M2",
                            help=f"{what} M2 file(s) for training")
    parser.add_argument("--wi-dev", type=Path, metavar="M2", help="W&I+LOCNESS dev M2")
    parser.add_argument("--conll13", type=Path, metavar="M2", help="CoNLL-2013 test M2 (valid)")
    parser.add_argument("--conll14", type=Path, metavar="M2", help="CoNLL-2014 test M2 (test)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--bpe-ops", type=int, default=30000,
                        help="joint BPE merge operations (default: %(default)s)")
    parser.add_argument("--annotator", type=int, default=0,
                        help="annotator whose edits make the targets (default: %(default)s)")
    parser.add_argument("--drop-unchanged", action="store_true",
                        help="drop training pairs whose source equals the target")
    parser.add_argument("--no-binarize", action="store_true",
                        help="stop after writing the BPE text files")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes for BPE and fairseq-preprocess (default: %(default)s)")
    args = parser.parse_args(argv)
    if not any(getattr(args, s) for s in TRAIN_SOURCES):
        parser.error("give at least one training M2 file (--lang8, --nucle, --fce, --wi-train)")
    given = [p for s in TRAIN_SOURCES for p in getattr(args, s)]
    given += [p for p in (args.wi_dev, args.conll13, args.conll14) if p]
    missing = [str(p) for p in given if not p.is_file()]
    if missing:
        parser.error("no such file: " + ", ".join(missing))
    return args


# --------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    splits, notes = {}, []
    train, stats = [], collections.Counter()
    for source in TRAIN_SOURCES:
        for path in getattr(args, source):
            pairs = m2_pairs(path, args.annotator)
            kept = [(s, t) for s, t in pairs if s and t
                    and not (args.drop_unchanged and s == t)]
            stats["sentences"] += len(pairs)
            stats["dropped: empty side"] += sum(1 for s, t in pairs if not s or not t)
            stats["dropped: unchanged"] += len(pairs) - len(kept) - sum(
                1 for s, t in pairs if not s or not t)
            print(f"  train <- {source} {path.name}: {len(kept)} of {len(pairs)} pairs")
            notes.append(f"train\t{source}\t{path}\t{len(kept)}")
            train += kept
    splits["train"] = train

    gold = {"conll13": args.conll13, "conll14": args.conll14, "wi_dev": args.wi_dev}
    roles = {"valid": args.conll13 and "conll13" or args.wi_dev and "wi_dev",
             "test": args.conll14 and "conll14"}
    if args.conll13 and args.wi_dev:
        roles["wi_dev"] = "wi_dev"
    (out / "gold").mkdir(exist_ok=True)
    for name, path in gold.items():
        if path:
            shutil.copyfile(path, out / "gold" / f"{name}.m2")
    for split, name in roles.items():
        if not name:
            notes.append(f"{split}\tmissing")
            print(f"  {split}: missing (no "
                  + ("--conll13 or --wi-dev" if split == "valid" else "--conll14") + ")")
            continue
        splits[split] = m2_pairs(gold[name], args.annotator)
        notes.append(f"{split}\t{name}\t{gold[name]}\t{len(splits[split])}")
        print(f"  {split} <- {name} {gold[name].name}: {len(splits[split])} sentences")

    for split, pairs in splits.items():
        for i, side in enumerate(("src", "tgt")):
            prep_common.write_lines(out / f"{split}.tok.{side}", [p[i] for p in pairs])
    for name in [n for n in ("valid", "test", "wi_dev") if n not in splits]:
        for side in ("src", "tgt"):  # from an earlier run with other inputs
            for kind in ("tok.", ""):
                stale = out / f"{name}.{kind}{side}"
                if stale.exists():
                    stale.unlink()
    prep_common.write_lines(out / "splits.txt", notes)
    for key, value in stats.items():
        print(f"  train {key}: {value}")

    print(f"Learning {args.bpe_ops} joint BPE operations on train source + target")
    codes = out / "bpe.codes"
    prep_common.learn_bpe([out / "train.tok.src", out / "train.tok.tgt"], codes, args.bpe_ops)
    for split in splits:
        for side in ("src", "tgt"):
            prep_common.write_lines(out / f"{split}.{side}", prep_common.apply_bpe_iter(
                codes, prep_common.iter_lines(out / f"{split}.tok.{side}"), args.workers))

    if args.no_binarize:
        if (out / "bin").is_dir():
            shutil.rmtree(out / "bin")
    else:
        binarized = [s for s in prep_common.SPLITS if s in splits]
        print("Running fairseq-preprocess")
        prep_common.binarize(out, "src", "tgt", args.workers, splits=binarized)
    print(f"Done in {time.time() - started:.0f}s; output in {out}")


if __name__ == "__main__":
    main()
