#!/usr/bin/env python
"""Where a sentence's time goes with the native engine at batch 1: the
generator's whole call, the engine's encoder call (``fa_begin``) and its
decoding loop (``fa_decode``), and the Python around them.

    python scripts/diagnostics/sentence_time.py DATA-BIN --path CKPT [--mode iad|greedy]
        [--sentences 300] [--threads 1] [--precision float32|int8] [--rounds 3] [--stages]
        [--load N] [--subset test]

Each round decodes every sentence twice: once plainly (the ``whole`` time) and
once with the two engine calls timed from Python (``encoder``, ``loop``; the
rest of that pass is ``python``).  ``--stages`` runs the engine's test
library and adds its stage timers' totals per sentence (csrc/model/stages.h; the
timers add their own cost).  Run it in two checkouts in turn to compare their
Python.  Greedy is the engine's loop with drafts of length 0.
"""
import argparse
import sys
import time

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.diagnostics.engine_runs import add_run_options, generators_on, load_for_runs


class _Timed:
    """An engine entry point that adds its calls' wall time to ``spent[key]``."""

    def __init__(self, fn, spent, key):
        self.fn, self.spent, self.key = fn, spent, key

    def __call__(self, *args):
        t0 = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.spent[self.key] += time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--mode", choices=["iad", "greedy"], default="iad")
    ap.add_argument("--stages", action="store_true", help="the engine's stage timers (its test library)")
    add_run_options(ap, precision="int8", rounds=3)
    ap.set_defaults(sentences=300, threads=1)
    a = ap.parse_args(argv)
    from fairseq_aggressive.native import build

    if a.stages:
        from fairseq_aggressive.diagnostics import stages

        stages.use_test_library()
    loaded = load_for_runs(a, build.test_library if a.stages else build.library, a.threads)
    if loaded is None:
        return 2
    lib, model, task, samples = loaded
    gen = generators_on(lib, model, task, a.threads)[a.mode]
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    print(f"machine: {describe_machine(machine_info())}; engine {lib._name}; {a.threads} threads; {a.precision}; "
          f"{a.mode}; {len(samples)} sentences; {a.load} CPU-bound processes beside it")

    def decode_all():
        t0 = time.perf_counter()
        for s in samples:
            gen.generate([model], s)
        return time.perf_counter() - t0

    plain = {"fa_begin": lib.fa_begin, "fa_decode": lib.fa_decode}
    with cpu_load(a.load):
        for s in samples[:30]:  # warm-up
            gen.generate([model], s)
        for rnd in range(a.rounds):
            whole = decode_all()
            spent = {"encoder": 0.0, "loop": 0.0}
            lib.fa_begin = _Timed(plain["fa_begin"], spent, "encoder")
            lib.fa_decode = _Timed(plain["fa_decode"], spent, "loop")
            if a.stages:
                stages.read()
            try:
                timed = decode_all()
            finally:
                lib.fa_begin, lib.fa_decode = plain["fa_begin"], plain["fa_decode"]
            per = {k: 1000 * v / len(samples) for k, v in spent.items()}
            print(f"round {rnd + 1}: whole {1000 * whole / len(samples):.3f} ms per sentence; timed pass "
                  f"{1000 * timed / len(samples):.3f}: encoder {per['encoder']:.3f}, loop {per['loop']:.3f}, "
                  f"python {1000 * timed / len(samples) - per['encoder'] - per['loop']:.3f}")
            if a.stages:
                st = {k: 1000 * v / len(samples) for k, v in stages.read().items() if v > 0}
                print("  stages, ms per sentence: " + ", ".join(f"{k} {v:.3f}" for k, v in st.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
