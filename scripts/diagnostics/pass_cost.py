#!/usr/bin/env python
"""Cost of one verification pass of the native engine at T positions.

    python scripts/diagnostics/pass_cost.py DATA-BIN --path CKPT [--sentences 200] [--threads 2]
        [--positions 1,2,4,8,16] [--shortlist N] [--subset test]

For each sentence, greedy's output is computed first; then one pass over
[EOS, the first T-1 output tokens] is timed on a freshly encoded batch, so
every drafted token is accepted and all T positions are projected (the most a
pass of T positions costs).  The encoder is not included.  Prints the median
and mean ms per pass for each T, side by side in one run, and names the machine.
"""
import argparse
import statistics
import time

import torch

from fairseq_aggressive.diagnostics.loading import load_model_and_samples


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--subset", default="test")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--positions", default="1,2,4,8,16")
    ap.add_argument("--shortlist", type=int, default=None, help="--vocab-shortlist N (approximate)")
    args = ap.parse_args(argv)
    positions = [int(p) for p in args.positions.split(",")]

    torch.set_num_threads(args.threads)
    model, task, samples = load_model_and_samples(args.data, args.path, args.subset, args.sentences,
                                                  task="aggressive_translation")
    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import AggressiveGenerator
    from fairseq_aggressive.shortlist import VocabShortlist

    d = task.target_dictionary
    shortlist = VocabShortlist(task.source_dictionary, d, args.shortlist) if args.shortlist else None
    gen = AggressiveGenerator([model], d, InputCopyDrafter(task.source_dictionary, d), max_len_a=1.2,
                              max_len_b=10, max_draft_len=0, engine="native", shortlist=shortlist,
                              native_threads=args.threads)
    outputs = [gen.generate([model], s)[0][0]["tokens"].tolist() for s in samples]
    print(f"machine: {describe_machine(machine_info())}; {args.threads} threads; engine {gen.native.isa}"
          + (f"; shortlist {args.shortlist}" if shortlist else ""))
    for T in positions:
        times = []
        for sample, out in zip(samples, outputs):
            if len(out) < T:
                continue
            batch = gen.native.begin(sample["net_input"]["src_tokens"], 1024, shortlist)
            row = [d.eos()] + out[: T - 1]
            t0 = time.perf_counter()
            _, _, n_match, _, _ = batch.step([0], [row], 1024, 1, 0.0, 1.0)
            times.append(time.perf_counter() - t0)
            assert n_match[0] == T - 1, "the pass did not accept greedy's own continuation"
        if times:
            print(f"T={T:3d}: {len(times)} passes, median {1000 * statistics.median(times):.3f} ms, "
                  f"mean {1000 * statistics.mean(times):.3f} ms per pass")


if __name__ == "__main__":
    main()
