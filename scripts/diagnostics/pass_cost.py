#!/usr/bin/env python
"""Cost of one verification pass of the native engine at T positions.

    python scripts/diagnostics/pass_cost.py DATA-BIN --path CKPT [--sentences 200] [--threads 2]
        [--positions 1,2,4,8,16] [--prefix 8] [--warm-steps 0] [--precision int8] [--shortlist N]
        [--subset test] [--load N] [--json F]

For each sentence, greedy's output is computed first; then, on a freshly
encoded batch whose cache already holds the first ``--prefix`` output tokens
(0: none), one pass over the next T positions ([last token, the next T-1
output tokens]) is timed, so every drafted token is accepted and all T
positions are projected (the most a pass of T positions costs; T=1 is a
greedy step).  ``--warm-steps N`` runs N one-token steps along greedy's output
(untimed) between the prefix and the timed pass, as a decode in the middle of
its sentence does: the encoder's run leaves the decoder's weights in memory,
each pass brings back into the outer caches what they can hold.  The encoder
is not included.  Prints the median and mean ms per pass for each T and its
ratio to T=1, side by side in one run (``--rounds`` alternating rounds over
the widths), and names the machine.  ``--load N`` times the passes beside N
CPU-bound processes.  ``--json F`` writes the run (its command, commit and machine, each T's
median and mean, the stages' ms) as a result ``scripts/results.py add`` stores.

``--stages`` runs the engine's test library, which times the stages of each
pass (csrc/model/stages.h), and adds a table: ms per pass in each stage for each T,
and what each adds to a one-position pass.
"""
import argparse
import statistics
import time

import torch

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.diagnostics.loading import load_model_and_samples


def main(argv=None):
    from fairseq_aggressive.bench.provenance import output_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--subset", default="test")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--positions", default="1,2,4,8,16")
    ap.add_argument("--shortlist", type=int, default=None, help="--vocab-shortlist N (approximate)")
    ap.add_argument("--prefix", type=int, default=0, help="output tokens in the cache before the timed pass")
    ap.add_argument("--warm-steps", type=int, default=0,
                    help="one-token steps (untimed) between the prefix and the timed pass")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the timed passes")
    ap.add_argument("--precision", choices=["float32", "int8"], default="float32",
                    help="int8: the model quantized as --inference-precision int8 does")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds over the widths")
    ap.add_argument("--stages", action="store_true",
                    help="time each stage of the passes (the engine's test library)")
    ap.add_argument("--json", type=output_file, default=None,
                    help="write the run's figures here (a result scripts/results.py stores)")
    ap.add_argument("--amx-min-rows", type=int, default=None,
                    help="AMX targets: the fewest rows an int8 product runs on AMX tiles (the engine's test library)")
    args = ap.parse_args(argv)
    if args.prefix < 0 or args.warm_steps < 0 or args.load < 0:
        ap.error("--prefix, --warm-steps and --load must be >= 0")
    if args.stages or args.amx_min_rows is not None:
        from fairseq_aggressive.diagnostics import stages

        stages.use_test_library()
    if args.amx_min_rows is not None:
        from fairseq_aggressive.native import build

        build.test_library().fa_set_amx_min_rows(args.amx_min_rows)
    positions = [int(p) for p in args.positions.split(",")]

    torch.set_num_threads(args.threads)
    model, task, samples = load_model_and_samples(args.data, args.path, args.subset, args.sentences,
                                                  precision=args.precision, task="aggressive_translation")
    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.shortlist import VocabShortlist

    d = task.target_dictionary
    shortlist = VocabShortlist(task.source_dictionary, d, args.shortlist) if args.shortlist else None
    gen = build_generator([model], d, InputCopyDrafter(task.source_dictionary, d), max_len_a=1.2,
                              max_len_b=10, max_draft_len=0, engine="native", shortlist=shortlist,
                              native_threads=args.threads)
    outputs = [gen.generate([model], s)[0][0]["tokens"].tolist() for s in samples]
    print(f"machine: {describe_machine(machine_info())}; {args.threads} threads; engine {gen.native.isa}; "
          f"{args.precision}; prefix {args.prefix}"
          + (f"; {args.warm_steps} warm steps" if args.warm_steps else "")
          + (f"; shortlist {args.shortlist}" if shortlist else "")
          + (f"; {args.load} CPU-bound processes beside it" if args.load else ""))
    with cpu_load(args.load):
        times, spent = time_passes(gen, d, samples, outputs, positions, args.prefix, args.warm_steps, args.rounds,
                                   stages if args.stages else None, shortlist)
    base = statistics.median(times[positions[0]]) if times[positions[0]] else None
    for T in positions:
        if times[T]:
            med = statistics.median(times[T])
            ratio = f", {med / base:.2f}x T={positions[0]}" if base else ""
            print(f"T={T:3d}: {len(times[T])} passes, median {1000 * med:.3f} ms, "
                  f"mean {1000 * statistics.mean(times[T]):.3f} ms per pass{ratio}")
    per = stage_ms(positions, times, spent) if args.stages else None
    if per:
        print_stages(per)
    if args.json:
        write_json(args, gen, samples, positions, times, per)


def write_json(args, gen, samples, positions, times, per):
    """The run as a result: its settings, each T's passes, median and mean ms, the stages' ms."""
    from fairseq_aggressive.bench.provenance import write_result
    from fairseq_aggressive.native.machine import machine_info

    res = {"kind": "pass_cost", "machine": dict(machine_info(), native_engine=gen.native.isa),
           "precision": args.precision, "prefix": args.prefix, "warm_steps": args.warm_steps, "load": args.load,
           "threads": args.threads, "sentences": len(samples), "shortlist": args.shortlist,
           "passes": {str(T): {"n": len(times[T]), "median_ms": 1000 * statistics.median(times[T]),
                               "mean_ms": 1000 * statistics.mean(times[T])} for T in positions if times[T]}}
    if per:
        res["stages_ms"] = {str(T): v for T, v in per.items()}
    write_result(args.json, res, "scripts/diagnostics/pass_cost.py", res["machine"])


def time_passes(gen, d, samples, outputs, positions, P, W, rounds, stages, shortlist):
    """For each width T, the seconds of each timed pass (and, with the stage
    timers, the seconds in each stage): on a fresh batch of each sentence, a
    pass over greedy's first P tokens, W one-token steps, then the timed pass
    over the next T positions."""
    from fairseq_aggressive.generator import length_cap

    # per sentence: its source, the decoder's input at each output position, and its cache
    # sized as decoding sizes it (fairseq's length rule), not for a longest sentence
    sents = [(s["net_input"]["src_tokens"], [d.eos()] + out,
              length_cap(gen.max_len_a, gen.max_len_b, s["net_input"]["src_tokens"].size(1), gen.max_len))
             for s, out in zip(samples, outputs)]
    times = {T: [] for T in positions}
    spent = {T: {} for T in positions}
    for _ in range(rounds):
        for T in positions:
            for src, inputs, max_len in sents:
                if len(inputs) - 1 < P + W + T:
                    continue
                batch = gen.native.begin(src, max_len, shortlist)
                if P > 0:  # the cache holds the first P output tokens
                    batch.step([0], [inputs[:P]], max_len, 1, 0.0, 1.0)
                for i in range(P, P + W):  # one-token steps along greedy's output
                    batch.step([0], [inputs[i: i + 1]], max_len, 1, 0.0, 1.0)
                row = inputs[P + W: P + W + T]
                if stages is not None:
                    stages.read()
                t0 = time.perf_counter()
                _, _, n_match, _, _ = batch.step([0], [row], max_len, 1, 0.0, 1.0)
                times[T].append(time.perf_counter() - t0)
                if stages is not None:
                    for name, sec in stages.read().items():
                        spent[T][name] = spent[T].get(name, 0.0) + sec
                assert n_match[0] == T - 1, "the pass did not accept greedy's own continuation"
    return times, spent


def stage_ms(positions, times, spent):
    """ms per pass in each stage for each T (mean; the pass's own time less its stages is its
    bookkeeping, the time around it "outside the pass")."""
    from fairseq_aggressive.diagnostics.stages import STAGES

    widths = [T for T in positions if times[T]]
    per = {T: {k: 1000 * v / len(times[T]) for k, v in spent[T].items()} for T in widths}
    names = [n for n in STAGES if n not in ("encoder", "pass") and any(per[T].get(n, 0) > 0 for T in widths)]
    out = {}
    for T in widths:
        out[T] = {n: per[T].get(n, 0.0) for n in names}
        out[T]["bookkeeping"] = per[T].get("pass", 0) - sum(per[T].get(n, 0) for n in names)
        out[T]["outside the pass"] = 1000 * statistics.mean(times[T]) - per[T].get("pass", 0)
    return out


def print_stages(per):
    """ms per pass in each stage, and for each T what each stage adds to the first T's pass."""
    widths = list(per)
    rows = list(per[widths[0]])
    base = widths[0]
    print("\nms per pass by stage (mean), and what each adds over T=%d:" % base)
    print("| stage | " + " | ".join(f"T={T}" for T in widths) + " | " +
          " | ".join(f"+ at T={T}" for T in widths[1:]) + " |")
    print("|---" * (1 + 2 * len(widths) - 1) + "|")
    for n in rows:
        cells = [f"{per[T][n]:.4f}" for T in widths]
        adds = [f"{per[T][n] - per[base][n]:+.4f}" for T in widths[1:]]
        print(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(adds) + " |")
    total = [sum(per[T].values()) for T in widths]
    print("| total | " + " | ".join(f"{t:.4f}" for t in total) + " | " +
          " | ".join(f"{t - total[0]:+.4f}" for t in total[1:]) + " |")


if __name__ == "__main__":
    main()
