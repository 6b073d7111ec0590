#!/usr/bin/env python
"""How few passes a drafter could need if it also guessed the new tokens of an edit.

    python scripts/diagnostics/span_predictability.py BENCH_JSON DATA-BIN [--subset test]
        [--source-lang src] [--target-lang tgt] [--train-subset train]

A drafter that copies the source needs, per edit span between the source and
greedy's output, one pass per output token in it (each pass emits one token it
did not draft; ``bench.bound_of_spans``).  A drafter that also predicted the
span's tokens would need one pass per span plus one per token it guessed wrong:
the first token of a span is the verifier's own (the pass that rejected the
copy emits it), the rest can be drafted after it, with copying resumed after the
span (re-anchoring assumed perfect, as in the copying bound).  This prints that
count for simple predictors of the next output token, from greedy's outputs in a
``fairseq-aggressive-bench --bench-json`` file and the binarized sources:

- copying only (the bound the bench prints);
- the most frequent next token after the previous one (and the two previous) in
  the training targets;
- the same from the outputs of the sentences decoded before (online);
- every token guessed (1 + E: the least any drafter whose first token of a span
  is the verifier's can need).
"""
import argparse
import json
from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple


def passes_for(src: Sequence[int], hyp: Sequence[int], guess: Callable[[Sequence[int]], Optional[int]],
               bos: int, spans: Optional[List[Tuple[int, int]]] = None) -> int:
    """1 + per edit span 1 + the span's tokens after its first that ``guess``
    (given the output before a token, BOS first) gets wrong; ``spans``: the
    edit spans' ranges in ``hyp`` (``bench.edit_span_ranges``), if already found."""
    from fairseq_aggressive.evaluation.edit_spans import edit_span_ranges

    if spans is None:
        spans = edit_span_ranges(list(src), list(hyp))
    ctx = [bos] + list(hyp)
    n = 1
    for s, e in spans:
        n += 1 + sum(guess(ctx[: p + 1]) != hyp[p] for p in range(s + 1, e))
    return n


class NextToken:
    """The most frequent next token after the last one or two (backing off)."""

    def __init__(self, order: int = 2):
        self.order = order
        self.counts: Dict[tuple, Counter] = defaultdict(Counter)

    def add(self, seq: Sequence[int]) -> None:
        for k in range(1, len(seq)):
            for n in range(1, self.order):
                if k - n >= 0:
                    self.counts[tuple(seq[k - n : k])][seq[k]] += 1

    def __call__(self, ctx: Sequence[int]) -> Optional[int]:
        for n in range(min(self.order - 1, len(ctx)), 0, -1):
            c = self.counts.get(tuple(ctx[-n:]))
            if c:
                return c.most_common(1)[0][0]
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", help="a fairseq-aggressive-bench --bench-json file (greedy's tokens per sentence)")
    ap.add_argument("data", help="the binarized data the bench decoded")
    ap.add_argument("--subset", default="test")
    ap.add_argument("--train-subset", default="train")
    ap.add_argument("--source-lang", default="src")
    ap.add_argument("--target-lang", default="tgt")
    args = ap.parse_args(argv)

    from fairseq.data import Dictionary, data_utils

    with open(args.bench_json) as f:
        bench = json.load(f)
    recs = [r for r in bench.get("per_sentence", []) if "tokens" in r.get("greedy", r.get("greedy-native", {}))]
    if not recs:
        raise SystemExit(f"{args.bench_json}: no per-sentence greedy tokens (run the bench with a greedy mode "
                         "and --bench-json)")
    s, t = args.source_lang, args.target_lang
    d = Dictionary.load(f"{args.data}/dict.{t}.txt")
    if Dictionary.load(f"{args.data}/dict.{s}.txt").symbols != d.symbols:
        raise SystemExit("the source and target dictionaries differ: copying needs a joined dictionary")

    def load(split, lang):
        ds = data_utils.load_indexed_dataset(f"{args.data}/{split}.{s}-{t}.{lang}", d)
        if ds is None:
            raise SystemExit(f"{args.data}/{split}.{s}-{t}.{lang}: not found")
        return ds

    sources = load(args.subset, s)
    train = load(args.train_subset, t)
    bos = d.eos()
    bigram, trigram, online = NextToken(2), NextToken(3), NextToken(2)
    for i in range(len(train)):
        seq = [bos] + train[i].tolist()
        bigram.add(seq)
        trigram.add(seq)

    from fairseq_aggressive.evaluation.edit_spans import edit_span_ranges

    predictors = {
        "copying only": lambda hyp: lambda ctx: None,
        "training targets, last token": lambda hyp: bigram,
        "training targets, last two tokens": lambda hyp: trigram,
        "earlier outputs, last token": lambda hyp: online,
        "every token guessed (1 + E)": lambda hyp: lambda ctx: hyp[len(ctx) - 1],
    }
    totals = Counter()
    for r in recs:
        hyp = r.get("greedy", r.get("greedy-native"))["tokens"]
        src = sources[r["id"]].tolist()
        spans = edit_span_ranges(src, hyp)  # one alignment per sentence, for every predictor
        for name, guess in predictors.items():
            totals[name] += passes_for(src, hyp, guess(hyp), bos, spans)
        online.add([bos] + list(hyp))
    n = len(recs)
    print(f"{n} sentences of {args.bench_json}; passes per sentence if in-span tokens after the first are guessed by:")
    print("| predictor | passes/sent |")
    print("|---|---|")
    for name, v in totals.items():
        print(f"| {name} | {v / n:.2f} |")


if __name__ == "__main__":
    main()
