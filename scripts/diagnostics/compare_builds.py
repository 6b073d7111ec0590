#!/usr/bin/env python
"""Two builds of the native engine side by side in one process: the speed of
whole sentences, alternating between the builds sentence by sentence, and
whether their outputs are the same bits.

    python scripts/diagnostics/compare_builds.py DATA-BIN --path CKPT --other LIBRARY
        [--sentences 100] [--threads 2] [--precision float32|int8] [--rounds 3] [--load N] [--subset test]

LIBRARY is an engine library file of the same API (another checkout's
``fairseq_aggressive/native/_engine_*.so``, or one from the build cache);
the other side is the library this checkout loads.  For greedy (the engine's,
``max_draft_len=0``) and IAD (the engine's loop), each sentence is decoded by
both builds in turn, ``--rounds`` times; prints ms per sentence of each, the
ratio, and in how many sentences the tokens and positional scores are the
same bits.  Host noise that drifts over minutes falls on both sides alike,
where two runs one after the other can differ by more than the change being
measured.  ``--load N`` runs it beside N CPU-bound processes.
"""
import argparse
import sys
import time

import torch

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.diagnostics.loading import load_model_and_samples


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--other", required=True, help="the other build's engine library file")
    ap.add_argument("--subset", default="test")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["float32", "int8"], default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")
    a = ap.parse_args(argv)

    from fairseq_aggressive.native import build, engine
    from fairseq_aggressive.native.build import NativeUnavailable

    try:
        libs = {"this": build.library(), "other": build._load(a.other)}
    except NativeUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    model, task, samples = load_model_and_samples(a.data, a.path, a.subset, a.sentences,
                                                  precision=a.precision, task="aggressive_translation")
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import AggressiveGenerator
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    d = task.target_dictionary
    gens = {}
    default_library = engine.library
    try:
        for side, lib in libs.items():
            engine.library = lambda isa=None, lib=lib: lib
            for mode, draft in (("greedy", 0), ("iad", None)):
                gens[(mode, side)] = AggressiveGenerator(
                    [model], d, InputCopyDrafter(task.source_dictionary, d), max_len_a=1.2, max_len_b=10,
                    max_draft_len=draft, engine="native", native_threads=a.threads)
    finally:
        engine.library = default_library
    print(f"machine: {describe_machine(machine_info())}; {a.threads} threads; {a.precision}; "
          f"{a.load} CPU-bound processes beside it; this: {libs['this']._name}; other: {a.other}")
    spent = {k: 0.0 for k in gens}
    outs = {k: [] for k in gens}
    with cpu_load(a.load):
        for s in samples[:5]:  # warm-up
            for g in gens.values():
                g.generate([model], s)
        for rnd in range(a.rounds):
            for s in samples:
                for k, g in gens.items():
                    t0 = time.perf_counter()
                    h = g.generate([model], s)[0][0]
                    spent[k] += time.perf_counter() - t0
                    if rnd == 0:
                        outs[k].append((h["tokens"].tolist(), h["positional_scores"].numpy().tobytes()))
    n = a.rounds * len(samples)
    for mode in ("greedy", "iad"):
        same = sum(x == y for x, y in zip(outs[(mode, "this")], outs[(mode, "other")]))
        this, other = (1000 * spent[(mode, side)] / n for side in ("this", "other"))
        print(f"{mode}: this build {this:.3f} ms per sentence, the other {other:.3f}: this one {other / this:.3f}x "
              f"as fast; the same bits in {same}/{len(samples)} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
