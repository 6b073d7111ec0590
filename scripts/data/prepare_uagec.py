#!/usr/bin/env python
"""Prepare the UA-GEC corpus as sentence-level fairseq data for GEC.

UA-GEC (Syvokon et al., CC-BY-4.0) holds Ukrainian learner texts with their
corrections, shipped offline by the ``ua-gec`` PyPI package.  This script turns
it into parallel data for a seq2seq model (source = erroneous sentence,
target = corrected sentence):

1. Read the annotated documents and cut them into aligned sentence pairs (see
   ``align_document``).  The package's own ``target_sentences`` files are NOT
   used: they are split independently of the source and drift out of line when
   an edit adds, drops or moves a sentence boundary.
2. Split: the corpus's train partition -> ``train`` (with every annotator's
   version of the 43 doubly annotated documents); its test partition is halved
   by document into ``valid`` and ``test`` (first annotator only, so every
   source sentence appears once).  Pairs are shuffled with a fixed seed.
3. Tokenize with sacremoses -> ``{split}.tok.{src,tgt}`` (and the untokenized
   ``{split}.raw.{src,tgt}`` references).
4. Learn a joint BPE on train source + target with subword-nmt -> ``bpe.codes``
   and ``{split}.{src,tgt}``.
5. Binarize with fairseq-preprocess (joined dictionary) -> ``bin/``.

``--from-text DIR`` starts at step 4 from ``DIR/{split}.tok.{src,tgt}`` (e.g.
the bundled sample in data/uagec-sample), so the ua-gec package is not needed.

Examples::

    python scripts/data/prepare_uagec.py --out data-bin/uagec
    python scripts/data/prepare_uagec.py --out /tmp/s --sample 4000,300,300 --no-binarize
    python scripts/data/prepare_uagec.py --from-text data/uagec-sample --out /tmp/p --bpe-ops 4000
"""

import argparse
import collections
import random
import re
import sys
import time
from pathlib import Path

from fairseq_aggressive.data_prep import common as prep_common
from fairseq_aggressive.data_prep.common import require

SPLITS = prep_common.SPLITS
SIDES = ("src", "tgt")

# Closing quotes/brackets that the corpus's sentence splitter sometimes puts at
# the start of the next sentence (e.g. `... скористати.` + `” Таким чином`).
CLOSING_RUN = re.compile(r'[”»)\]"]+(?=\s|$)')

# Keep word-internal apostrophes (пам'ять, м’ята, сімʼя): Moses splits them
# for every language except en/fr/it.
APOSTROPHE_WORD = r"\w+(?:['’ʼ]\w+)+"


# --------------------------------------------------------------------------
# Command line


def parse_sample(value):
    """Parse ``N_TRAIN,N_VALID,N_TEST`` into a {split: N} dict."""
    parts = value.split(",")
    if len(parts) != len(SPLITS) or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected three non-negative integers N_TRAIN,N_VALID,N_TEST, got {value!r}")
    return dict(zip(SPLITS, map(int, parts)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the pipeline and examples.")
    parser.add_argument("--out", required=True, type=Path,
                        help="output directory (text files, bpe.codes and bin/)")
    parser.add_argument("--from-text", type=Path, metavar="DIR",
                        help="skip corpus reading and tokenization; start from the "
                             "tokenized files DIR/{train,valid,test}.tok.{src,tgt}")
    parser.add_argument("--layer", default="gec-only", choices=("gec-only", "gec-fluency"),
                        help="UA-GEC annotation layer: grammar/spelling/punctuation edits "
                             "only, or also fluency (style) edits (default: %(default)s)")
    parser.add_argument("--max-words", type=int, default=100,
                        help="drop pairs whose source or target has more whitespace-"
                             "separated words than this (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the valid/test document split and of the pair "
                             "shuffling (default: %(default)s)")
    parser.add_argument("--sample", type=parse_sample, metavar="N_TRAIN,N_VALID,N_TEST",
                        help="keep only the first N pairs of each split (after shuffling)")
    parser.add_argument("--bpe-ops", type=int, default=8000,
                        help="number of joint BPE merge operations (default: %(default)s)")
    parser.add_argument("--no-binarize", action="store_true",
                        help="stop after writing the BPE text files")
    parser.add_argument("--workers", type=int, default=2,
                        help="fairseq-preprocess workers (default: %(default)s)")
    parser.add_argument("--examples", type=int, default=3,
                        help="number of corrected valid pairs to print (default: %(default)s)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------
# Sentence alignment of one annotated document


def sentence_spans(text, sentences):
    """Character spans (start, end) of `sentences` in `text`, without outer spaces.

    The package's sentence files equal the document text up to whitespace, so
    each sentence is located by counting its non-space characters.
    """
    nonspace = [i for i, ch in enumerate(text) if not ch.isspace()]
    spans, k = [], 0
    for sentence in sentences:
        n = len("".join(sentence.split()))
        if n:
            spans.append((nonspace[k], nonspace[k + n - 1] + 1))
            k += n
    if k != len(nonspace):
        raise ValueError("sentence file does not match the document text")
    return spans


def reattach_closing_quotes(text, spans):
    """Give closing quotes/brackets at a sentence start back to the sentence before."""
    fixed = spans[:1]
    for start, end in spans[1:]:
        match = CLOSING_RUN.match(text, start, end)
        prev_start, prev_end = fixed[-1]
        # A straight quote only closes if the previous sentence left one open.
        if match and ('"' not in match.group() or text[prev_start:prev_end].count('"') % 2):
            fixed[-1] = (prev_start, match.end())
            rest = text[match.end():end]
            start = end - len(rest.lstrip())
            if start == end:
                continue
        fixed.append((start, end))
    return fixed


def correction(edit):
    """Text that replaces an edit's source span (its first suggestion)."""
    text = edit.suggestions[0] if edit.suggestions else edit.source_text
    return text.replace("\\n", "\n")


def by_position(edits):
    return sorted(edits, key=lambda e: (e.start, e.end))


def touches(edit, start, end):
    """Whether `edit` changes text inside [start, end] (insertions: at its ends too)."""
    if edit.start == edit.end:
        return start <= edit.start <= end
    return edit.start < end and edit.end > start


def group_edits(spans, edits):
    """Assign every edit to a sentence; merge the sentences that one edit crosses.

    Returns a list of [start, end, edits] groups.  Whitespace-only edits between
    two sentences are dropped; other edits in a gap join the sentence before.
    """
    groups = [[start, end, []] for start, end in spans]
    for edit in by_position(edits):
        hit = [i for i, (start, end, _) in enumerate(groups) if touches(edit, start, end)]
        if not hit:
            if not (edit.source_text + correction(edit)).strip():
                continue
            hit = [max([i for i, group in enumerate(groups) if group[0] <= edit.start] or [0])]
        first = hit[0]
        last = hit[-1] if edit.start < edit.end else first
        members = groups[first:last + 1]
        groups[first:last + 1] = [[min(members[0][0], edit.start),
                                   max(members[-1][1], edit.end),
                                   [e for group in members for e in group[2]] + [edit]]]
    return groups


def normalize_space(text):
    return " ".join(text.split())


def render(text, start, end, edits):
    """(source, target) text of the span [start, end) with `edits` applied."""
    pieces, pos = [], start
    for edit in by_position(edits):
        pieces += [text[pos:edit.start], correction(edit)]
        pos = edit.end
    pieces.append(text[pos:end])
    return normalize_space(text[start:end]), normalize_space("".join(pieces))


def align_document(doc):
    """Aligned (source, target) sentence pairs of a ua_gec Document, and #merges.

    Source sentence boundaries come from the package's ``source_sentences``;
    the target side of each sentence is rendered from the document's edits.
    A boundary that an edit crosses is dropped (the two sentences are merged).
    """
    text = doc.annotated.get_original_text()
    spans = sentence_spans(text, doc.source_sentences)
    if not spans:
        return [], 0
    spans = reattach_closing_quotes(text, spans)
    groups = group_edits(spans, doc.annotated.get_annotations())
    pairs = [render(text, start, end, edits) for start, end, edits in groups]
    return pairs, len(spans) - len(groups)


def covers_document(doc, pairs):
    """Sanity check: the pairs reproduce the whole document (ignoring spacing).

    Fails e.g. when an .ann file has a literal "\\n" outside an edit, which
    shifts the package's edit offsets (test doc 0906, annotator 2).
    """
    def squeeze(s):
        return "".join(s.split())
    return (squeeze("".join(src for src, _ in pairs)) == squeeze(doc.source)
            and squeeze("".join(tgt for _, tgt in pairs)) == squeeze(doc.target))


# --------------------------------------------------------------------------
# Corpus reading and splitting


def read_partition(ua_gec, partition, layer, first_annotator_only, stats):
    """{doc_id: [(source, target), ...]} for one corpus partition."""
    docs = collections.defaultdict(list)
    for doc in ua_gec.Corpus(partition=partition, annotation_layer=layer):
        if first_annotator_only and doc.meta.annotator_id != 1:
            continue
        try:
            pairs, merged = align_document(doc)
            usable = covers_document(doc, pairs)
        except ValueError:  # the sentence file does not match the document
            usable = False
        if not usable:
            stats["annotated documents skipped (alignment check failed)"] += 1
            continue
        stats["annotated documents used"] += 1
        stats["sentence pairs"] += len(pairs)
        stats["merged sentence boundaries"] += merged
        docs[doc.doc_id].extend(pairs)
    return docs


def keep_pair(pair, max_words, stats):
    src, tgt = pair
    if not src or not tgt:
        stats["dropped: empty side"] += 1
        return False
    if max(len(src.split()), len(tgt.split())) > max_words:
        stats["dropped: too long"] += 1
        return False
    return True


def read_corpus(layer, seed, max_words):
    """{split: [(source, target), ...]} of untokenized, shuffled UA-GEC pairs."""
    ua_gec = require("ua_gec", "install the `ua-gec` package (pip install ua-gec), "
                               "or use --from-text DIR with already tokenized files")
    print(f"Reading UA-GEC {ua_gec.__version__}, layer {layer}")
    stats = collections.Counter()
    rng = random.Random(seed)
    train_docs = read_partition(ua_gec, "train", layer, False, stats)
    test_docs = read_partition(ua_gec, "test", layer, True, stats)
    doc_ids = sorted(test_docs)
    rng.shuffle(doc_ids)
    half = len(doc_ids) // 2
    docs = {"train": train_docs,
            "valid": {d: test_docs[d] for d in doc_ids[:half]},
            "test": {d: test_docs[d] for d in doc_ids[half:]}}
    splits = {}
    for split in SPLITS:
        pairs = [p for d in sorted(docs[split]) for p in docs[split][d]]
        splits[split] = [p for p in pairs if keep_pair(p, max_words, stats)]
        rng.shuffle(splits[split])
        print(f"  {split}: {len(docs[split])} documents")
    for key, value in stats.items():
        print(f"  {key}: {value}")
    return splits


def take_sample(splits, sample):
    if not sample:
        return splits
    return {split: pairs[:sample[split]] for split, pairs in splits.items()}


# --------------------------------------------------------------------------
# Text files


def read_splits(directory, kind):
    """Read ``directory/{split}.{kind}.{src,tgt}`` back into {split: pairs}."""
    paths = {(split, side): directory / prep_common.split_file(split, side, kind)
             for split in SPLITS for side in SIDES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        sys.exit("error: missing input files: " + ", ".join(missing))
    splits = {}
    for split in SPLITS:
        src, tgt = (prep_common.read_lines(paths[split, side]) for side in SIDES)
        if len(src) != len(tgt):
            sys.exit(f"error: {paths[split, 'src']} has {len(src)} lines but "
                     f"{paths[split, 'tgt']} has {len(tgt)}")
        splits[split] = list(zip(src, tgt))
    return splits


def tokenize_splits(splits):
    return prep_common.map_splits(lambda lines, side: prep_common.tokenize(
        lines, "uk", escape=False, protected_patterns=[APOSTROPHE_WORD]), splits, SIDES)


def print_stats(splits, examples):
    for split, pairs in splits.items():
        unchanged = sum(src == tgt for src, tgt in pairs)
        tokens = sum(len(src.split()) for src, _ in pairs)
        print(f"  {split}: {len(pairs)} pairs, {unchanged} unchanged "
              f"({100 * unchanged / max(len(pairs), 1):.1f}%), "
              f"{tokens / max(len(pairs), 1):.1f} source tokens/pair")
    corrected = [pair for pair in splits["valid"] if pair[0] != pair[1]]
    for src, tgt in corrected[:examples]:
        print(f"    src: {src}\n    tgt: {tgt}")


# --------------------------------------------------------------------------
# BPE and binarization


def binarize(out, workers):
    """Run fairseq-preprocess on ``out/{split}.{src,tgt}`` into ``out/bin``."""
    prep_common.binarize(out, "src", "tgt", workers, verbose=True)


# --------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    started = time.time()

    if args.from_text:
        tokenized = take_sample(read_splits(args.from_text, "tok"), args.sample)
    else:
        raw = take_sample(read_corpus(args.layer, args.seed, args.max_words), args.sample)
        prep_common.write_splits(args.out, raw, SIDES, "raw")
        tokenized = tokenize_splits(raw)
    prep_common.write_splits(args.out, tokenized, SIDES, "tok")
    print("Tokenized data:")
    print_stats(tokenized, args.examples)

    print(f"Learning {args.bpe_ops} joint BPE operations")
    prep_common.write_splits(args.out, prep_common.learn_and_apply_bpe(
        tokenized, SIDES, args.out / "bpe.codes", args.bpe_ops), SIDES)
    if not args.no_binarize:
        binarize(args.out, args.workers)
    print(f"Done in {time.time() - started:.0f}s; output in {args.out}")


if __name__ == "__main__":
    main()
