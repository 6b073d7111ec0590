#!/usr/bin/env python
"""Two builds of the native engine side by side in one process: the speed of
whole sentences, alternating between the builds sentence by sentence, and
whether their outputs are the same bits.

    python scripts/diagnostics/compare_builds.py DATA-BIN --path CKPT --other LIBRARY [--this LIBRARY]
        [--sentences 100] [--threads 2] [--precision float32|int8] [--rounds 3] [--load N] [--subset test]
        [--first this|other] [--by sentence|round]

LIBRARY is an engine library file of the same API (another checkout's
``fairseq_aggressive/native/_engine_*.so``, or one from the build cache);
this side is ``--this`` or the library this checkout loads.  Each side's
engines run on its own library (printed; the script refuses to run where they
do not).  For greedy (the engine's, ``max_draft_len=0``) and IAD (the engine's
loop), each sentence is decoded by both builds in turn (every other sentence
in the reverse order), ``--rounds`` times, and so is the encoder alone (the
engine's encoder with the decoder's keys and values of the source, as a batch
begins); prints ms per sentence of each, the ratio, and in how many sentences
the tokens and positional scores (the encoder: its output) are the same bits.
Host noise that drifts over minutes falls on both sides alike, where two runs
one after the other can differ by more than the change being measured.
``--load N`` runs it beside N CPU-bound processes.
``--by round`` runs each build (and each of its modes) over every sentence
in turn instead, every other round in the reverse order: each keeps its
weights in the caches from one sentence to the next, as a service of one
model does, where alternating sentence by sentence reads a model larger
than the outer caches' share from memory at each sentence (on a 2-core Xeon
guest, d=512 int8, the encoder alone 3.4-3.9 ms per sentence by round
against 5.0-5.4 by sentence).

Compare builds made the same way (two from the build cache, or two packaged
ones): a package build's compiler flags differ from the cache's.  With more
than one thread per side, run a null pair first (a copy of one library file
against itself) and every comparison twice, once with ``--first other``: the
side whose engines are made first can run faster (on a 2-core Zen 4 guest,
2 threads, d=512 int8, a null pair's IAD 1.12-1.25x, whichever side came
first; with 1 thread within 3%).
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
    ap.add_argument("--other", required=True, help="the other build's engine library file")
    ap.add_argument("--this", dest="this", default=None,
                    help="this side's engine library file (default: the one this checkout loads)")
    add_run_options(ap, precision="float32", rounds=3)
    ap.add_argument("--first", choices=["this", "other"], default="this", help="the side whose engines are made first")
    ap.add_argument("--by", choices=["sentence", "round"], default="sentence",
                    help="alternate the builds sentence by sentence, or run each over every sentence in turn "
                         "(its weights stay in the caches from one sentence to the next)")
    a = ap.parse_args(argv)

    from fairseq_aggressive.native import build

    loaded = load_for_runs(a, lambda: {"this": build._load(a.this) if a.this else build.library(),
                                       "other": build._load(a.other)}, a.threads)
    if loaded is None:
        return 2
    libs, model, task, samples = loaded
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    order = ["this", "other"] if a.first == "this" else ["other", "this"]
    gens = {(mode, side): g for side in order for mode, g in generators_on(libs[side], model, task, a.threads).items()}
    ran = {side: {g.verifier.engine.lib._name for (_, s), g in gens.items() if s == side} for side in libs}
    if ran["this"] & ran["other"]:
        print(f"error: both sides run {sorted(ran['this'] & ran['other'])}: nothing to compare", file=sys.stderr)
        return 2
    print(f"machine: {describe_machine(machine_info())}; {a.threads} threads; {a.precision}; "
          f"{a.load} CPU-bound processes beside it; this: {libs['this']._name}; other: {a.other}; "
          f"engines made first: {a.first}'s")
    for side in libs:
        print(f"{side} side's engines run: {', '.join(sorted(ran[side]))}")

    runs = {k: decode_run(g, model) for k, g in gens.items()}
    runs.update({("encoder", side): encode_run(gens[("greedy", side)].verifier.engine) for side in libs})
    spent = {k: 0.0 for k in runs}
    outs = {k: [] for k in runs}
    with cpu_load(a.load):
        for s in samples[:5]:  # warm-up
            for run in runs.values():
                run(s)
        order = list(runs)
        for rnd in range(a.rounds):
            if a.by == "sentence":
                for i, s in enumerate(samples):
                    # every other sentence in the reverse order: no side always runs after the other
                    for k in order if (rnd + i) % 2 == 0 else order[::-1]:
                        timed(runs, k, s, spent, outs, rnd)
            else:  # each run over every sentence in turn, every other round in the reverse order
                for k in order if rnd % 2 == 0 else order[::-1]:
                    for s in samples:
                        timed(runs, k, s, spent, outs, rnd)
    n = a.rounds * len(samples)
    for mode in ("greedy", "iad", "encoder"):
        same = sum(x == y for x, y in zip(outs[(mode, "this")], outs[(mode, "other")]))
        this, other = (1000 * spent[(mode, side)] / n for side in ("this", "other"))
        print(f"{mode}: this build {this:.3f} ms per sentence, the other {other:.3f}: this one {other / this:.3f}x "
              f"as fast; the same bits in {same}/{len(samples)} sentences")
    return 0


def timed(runs, k, sample, spent, outs, rnd):
    dt, out = runs[k](sample)
    spent[k] += dt
    if rnd == 0:
        outs[k].append(out)


if __name__ == "__main__":
    sys.exit(main())
