#!/usr/bin/env python
"""How many pieces per thread the engine's shared products are cut into,
compared in one process: the engine's test library (whose pieces per thread
can change between calls), each sentence decoded with every setting in turn
(the order rotating from sentence to sentence): greedy, then IAD (the engine's
loops), then the encoder alone.

    python scripts/diagnostics/product_pieces.py DATA-BIN --path CKPT [--pieces 1 2 4]
        [--sentences 100] [--threads 2] [--precision float32|int8] [--rounds 2] [--load N] [--subset test]

Prints ms per sentence of each setting, its ratio to the first, and in how
many sentences every setting gave the same bits (tokens and positional
scores; the encoder: its output).  The engine's own builds use one piece per
thread (csrc/cpu/linear_int8.h says why); the test library is slower than them by
its stage timers, alike for every setting.  The same engines serve every
setting, so host noise that drifts over minutes falls on all of them alike.
``--load N`` runs it beside N CPU-bound processes.
"""
import argparse
import sys

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.diagnostics.engine_runs import (add_run_options, decode_run, encode_run, generators_on,
                                                        load_for_runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--pieces", type=int, nargs="+", default=[1, 4], help="settings to compare (each >= 1)")
    add_run_options(ap, precision="int8", rounds=2)
    a = ap.parse_args(argv)
    if min(a.pieces) < 1 or len(set(a.pieces)) != len(a.pieces):
        ap.error("--pieces: distinct values >= 1")

    from fairseq_aggressive.native import build

    loaded = load_for_runs(a, build.test_library, a.threads)
    if loaded is None:
        return 2
    lib, model, task, samples = loaded
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    gens = generators_on(lib, model, task, a.threads)
    eng = gens["greedy"].verifier.engine
    if eng.lib._name != lib._name:
        print(f"error: the engines run {eng.lib._name}, not the test library", file=sys.stderr)
        return 2
    print(f"machine: {describe_machine(machine_info())}; {a.threads} threads; {a.precision}; "
          f"{a.load} CPU-bound processes beside it; library: {lib._name}")

    runs = {"greedy": decode_run(gens["greedy"], model), "iad": decode_run(gens["iad"], model),
            "encoder": encode_run(eng)}
    spent = {(k, p): 0.0 for k in runs for p in a.pieces}
    outs = {(k, i): set() for k in runs for i in range(len(samples))}
    previous = lib.fa_set_product_pieces(a.pieces[0])
    try:
        with cpu_load(a.load):
            for s in samples[:5]:  # warm-up
                for p in a.pieces:
                    lib.fa_set_product_pieces(p)
                    for run in runs.values():
                        run(s)
            for k, run in runs.items():  # one mode at a time: the other engine's pool stays asleep
                for rnd in range(a.rounds):
                    for i, s in enumerate(samples):
                        j = (i + rnd) % len(a.pieces)  # no setting always runs first
                        for p in a.pieces[j:] + a.pieces[:j]:
                            lib.fa_set_product_pieces(p)
                            dt, out = run(s)
                            spent[(k, p)] += dt
                            outs[(k, i)].add(out)
    finally:
        lib.fa_set_product_pieces(previous)
    n = a.rounds * len(samples)
    first = a.pieces[0]
    for k in runs:
        same = sum(len(outs[(k, i)]) == 1 for i in range(len(samples)))
        cells = ", ".join(f"{p} per thread {1000 * spent[(k, p)] / n:.3f} ms "
                          f"({spent[(k, p)] / spent[(k, first)]:.3f}x the time of {first})" for p in a.pieces)
        print(f"{k}: {cells}; the same bits in {same}/{len(samples)} sentences")
    for mode, g in gens.items():
        st = g.verifier.engine.pool_stats()
        print(f"{mode}'s engine: {st['parallel']} of {st['calls']} calls of several items shared with the workers, "
              f"{st['stalls']} stalls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
