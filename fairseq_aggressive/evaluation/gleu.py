"""GLEU for grammatical error correction.

Napoles et al. (2015) "Ground Truth for Grammatical Error Correction
Metrics", with the 2016 update "GLEU Without Tuning" (arXiv:1605.02592),
independently re-implemented.

For every sentence and a chosen reference R (source S, hypothesis H, n-gram
counts as multisets, n = 1..4)::

    matches_n = max(0, |H_n & R_n| - |H_n & (S_n \\ R_n)|)
    total_n   = max(0, len(H) - n + 1)

where ``S_n \\ R_n`` keeps the source n-grams that do *not* occur in R (with
their source counts) and ``&`` is multiset intersection (min of counts).
Statistics are summed over the corpus and

    GLEU = BP * exp(mean_n log(matches_n / total_n)),
    BP   = exp(min(0, 1 - ref_len / hyp_len))

and GLEU = 0 if any summed statistic is 0 (no smoothing at corpus level).

Multiple references: as in the official ``compute_gleu`` script, each
iteration picks one reference per sentence at random and the reported score
is the mean over iterations (default 500).  The choice is deterministic:
iteration ``j`` draws ``random.Random(101 * j).randint(0, R - 1)`` for each
sentence in order.  With a single reference there is one iteration and the
score is exact.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import Counter
from typing import List, Optional, Sequence
from . import read_lines

ORDER = 4


def ngram_counts(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def sentence_stats(hyp: Sequence[str], src: Sequence[str], ref: Sequence[str], order: int = ORDER) -> List[int]:
    """[hyp_len, ref_len, matches_1, total_1, ..., matches_N, total_N]."""
    stats = [len(hyp), len(ref)]
    for n in range(1, order + 1):
        h, r, s = ngram_counts(hyp, n), ngram_counts(ref, n), ngram_counts(src, n)
        s_not_in_r = Counter({g: c for g, c in s.items() if g not in r})
        matches = sum((h & r).values()) - sum((h & s_not_in_r).values())
        stats.append(max(0, matches))
        stats.append(max(0, len(hyp) - n + 1))
    return stats


def gleu_from_stats(stats: Sequence[int], order: int = ORDER) -> float:
    if any(x == 0 for x in stats):
        return 0.0
    hyp_len, ref_len = stats[0], stats[1]
    log_p = sum(math.log(stats[2 + 2 * k] / stats[3 + 2 * k]) for k in range(order)) / order
    return math.exp(min(0.0, 1.0 - ref_len / hyp_len) + log_p)


def corpus_gleu_iterations(
    sources: Sequence[str],
    references: Sequence[Sequence[str]],
    hypotheses: Sequence[str],
    iterations: int = 500,
    order: int = ORDER,
) -> List[float]:
    """GLEU per iteration.  ``references[k]`` holds the lines of reference file k."""
    n_sent = len(sources)
    if len(hypotheses) != n_sent or any(len(r) != n_sent for r in references):
        raise ValueError("source, reference and hypothesis files must have the same number of lines")
    if not references:
        raise ValueError("at least one reference is needed")
    n_ref = len(references)
    if n_ref == 1:
        iterations = 1
    src_tok = [s.split() for s in sources]
    hyp_tok = [h.split() for h in hypotheses]
    cache = {}

    def stats(i, k):
        key = (i, k)
        if key not in cache:
            cache[key] = sentence_stats(hyp_tok[i], src_tok[i], references[k][i].split(), order)
        return cache[key]

    scores = []
    for j in range(iterations):
        rng = random.Random(101 * j)
        total = [0] * (2 + 2 * order)
        for i in range(n_sent):
            k = rng.randint(0, n_ref - 1) if n_ref > 1 else 0
            for x, v in enumerate(stats(i, k)):
                total[x] += v
        scores.append(gleu_from_stats(total, order))
    return scores


def corpus_gleu(sources, references, hypotheses, iterations: int = 500, order: int = ORDER) -> float:
    scores = corpus_gleu_iterations(sources, references, hypotheses, iterations, order)
    return sum(scores) / len(scores)


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="fairseq-aggressive-gleu",
        description="GLEU for GEC (Napoles et al. 2015/2016). Prints the corpus score.",
    )
    p.add_argument("-s", "--source", required=True, help="tokenized source sentences")
    p.add_argument("-r", "--reference", required=True, nargs="+", help="tokenized reference file(s)")
    p.add_argument("-o", "--hypothesis", required=True, help="tokenized system output")
    p.add_argument("-n", type=int, default=ORDER, help="max n-gram order (default 4)")
    p.add_argument("--iter", type=int, default=500, help="iterations for multiple references (default 500)")
    p.add_argument("--detail", action="store_true", help="also print std and 95%% interval over iterations")
    args = p.parse_args(argv)
    try:
        src = read_lines(args.source)
        refs = [read_lines(r) for r in args.reference]
        hyp = read_lines(args.hypothesis)
        scores = corpus_gleu_iterations(src, refs, hyp, max(1, args.iter), args.n)
    except (OSError, ValueError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    mean = sum(scores) / len(scores)
    if args.detail:
        std = statistics.pstdev(scores) if len(scores) > 1 else 0.0
        print(f"{mean:.6f} {std:.6f} ({mean - 1.96 * std:.3f},{mean + 1.96 * std:.3f})")
    else:
        print(f"{mean:.6f}")
    return 0


def main() -> None:
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
