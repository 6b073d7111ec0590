#!/usr/bin/env python
"""Does a second engine thread pay for this model on this machine now?  Two
engines on one copy of the weights, one with 1 thread and one with
``--threads``, decode the same sentences (IAD, the engine's loop), each
sentence by both in turn (every other sentence in the reverse order), so host
noise that drifts over minutes falls on both alike.

    python scripts/diagnostics/threads_side_by_side.py DATA-BIN --path CKPT [--threads 2]
        [--sentences 300] [--precision float32|int8] [--rounds 1] [--load N] [--subset test]

Prints ms per sentence of each, the ratio, the share of the many-thread
engine's calls its pool shared with its workers, and in how many sentences
the two gave the same bits (always all: the thread count never changes a
result).  Run it a few times a few minutes apart on a virtual machine whose
speed drifts: docs/threads-and-load.md has such runs.
"""
import argparse
import sys

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.diagnostics.engine_runs import add_run_options, decode_run, generators_on, load_for_runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    add_run_options(ap, precision="int8", rounds=1)
    a = ap.parse_args(argv)
    if a.threads < 2:
        ap.error("--threads: 2 or more (compared with 1)")

    from fairseq_aggressive.native import build
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    loaded = load_for_runs(a, build.library, 1)
    if loaded is None:
        return 2
    lib, model, task, samples = loaded
    counts = (1, a.threads)
    gens = {t: generators_on(lib, model, task, t)["iad"] for t in counts}  # the second shares the first's weights
    print(f"machine: {describe_machine(machine_info())}; {a.precision}; {a.load} CPU-bound processes beside it")
    runs = {t: decode_run(g, model) for t, g in gens.items()}
    spent = {t: 0.0 for t in counts}
    outs = [set() for _ in samples]
    with cpu_load(a.load):
        for s in samples[:5]:  # warm-up
            for run in runs.values():
                run(s)
        for rnd in range(a.rounds):
            for i, s in enumerate(samples):
                for t in counts if (i + rnd) % 2 == 0 else counts[::-1]:
                    dt, out = runs[t](s)
                    spent[t] += dt
                    outs[i].add(out)
    n = a.rounds * len(samples)
    st = gens[a.threads].verifier.engine.pool_stats()
    shared = st["parallel"] / st["calls"] if st["calls"] else 0.0
    print(f"iad: 1 thread {1000 * spent[1] / n:.3f} ms per sentence, {a.threads} threads "
          f"{1000 * spent[a.threads] / n:.3f}: {spent[1] / spent[a.threads]:.2f}x as fast; "
          f"{100 * shared:.1f}% of its calls of several items shared; "
          f"the same bits in {sum(len(o) == 1 for o in outs)}/{len(samples)} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
