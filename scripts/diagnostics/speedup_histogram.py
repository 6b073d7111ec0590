"""The per-sentence speedup of one benchmark mode over another (GAD's Figure 8),
from a ``fairseq-aggressive-bench --bench-json`` result: a histogram table
and, with ``--plot``, a PNG.

    python scripts/diagnostics/speedup_histogram.py BENCH.json --mode iad --base greedy [--bins 0.5] [--plot OUT.png]

A sentence's speedup is the base mode's milliseconds for it over the mode's
(a batch's time is shared by its sentences, so use ``--batch-size 1`` runs).
"""
import argparse
import json
import math
import statistics
import sys


def speedups(result, mode, base):
    out = []
    for rec in result["per_sentence"]:
        if mode not in rec or base not in rec:
            raise SystemExit(f"error: sentence {rec.get('id')} has no {mode if mode not in rec else base} "
                             f"(modes of the run: {', '.join(result['modes'])})")
        if rec[mode]["ms"] > 0:
            out.append(rec[base]["ms"] / rec[mode]["ms"])
    return out


def histogram(values, width):
    """{bin start: count} over bins of ``width`` from 0."""
    counts = {}
    for v in values:
        start = math.floor(v / width) * width
        counts[start] = counts.get(start, 0) + 1
    return dict(sorted(counts.items()))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json")
    p.add_argument("--mode", required=True)
    p.add_argument("--base", default="greedy")
    p.add_argument("--bins", type=float, default=0.5, help="bin width (default 0.5)")
    p.add_argument("--plot", default=None, help="write the histogram as a PNG here")
    args = p.parse_args(argv)
    if not args.bins > 0:
        raise SystemExit("error: --bins must be > 0")
    with open(args.bench_json, encoding="utf-8") as f:
        result = json.load(f)
    values = speedups(result, args.mode, args.base)
    if not values:
        raise SystemExit("error: no sentence with a time")
    hist = histogram(values, args.bins)
    print(f"{args.mode} against {args.base}, {len(values)} sentences, batch {result.get('batch_size')}: "
          f"median {statistics.median(values):.2f}x, mean {statistics.mean(values):.2f}x, "
          f"{sum(v < 1 for v in values)} slower")
    print("| speedup | sentences |\n|---|---|")
    for start, n in hist.items():
        print(f"| {start:.2f}-{start + args.bins:.2f}x | {n} |")
    if args.plot:
        import logging

        import matplotlib

        logging.getLogger("matplotlib").setLevel(logging.WARNING)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
        ax.bar(list(hist), list(hist.values()), width=args.bins * 0.9, align="edge")
        ax.set_xlabel(f"speedup of {args.mode} over {args.base} (per sentence)")
        ax.set_ylabel("sentences")
        ax.set_title(f"{len(values)} sentences, batch {result.get('batch_size')}", fontsize=10)
        if result.get("machine"):
            from fairseq_aggressive.native.machine import describe_machine

            fig.suptitle(describe_machine(result["machine"]), fontsize=7, wrap=True)
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
