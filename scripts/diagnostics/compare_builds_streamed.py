#!/usr/bin/env python
"""Two builds of the native engine side by side on streams: a model
directory's Translator on each build, every sentence of a file streamed through
B rows (``Translator.translate_batch``, lanes as it deals them), the builds
taking turns round by round (every other round in the reverse order), in one
process; prints each build's best and median ms per sentence and the ratio of
the medians, and refuses to time builds whose outputs differ.

    python scripts/diagnostics/compare_builds_streamed.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        --other LIBRARY [--this LIBRARY] [--rows 8,32,128] [--rounds 6] [--repeat 2] [--int8]
        [--decoding greedy|iad] [--sentences 300] [--first this|other]

LIBRARY is an engine library file of the same API (one from the build cache,
``~/.cache/fairseq_aggressive/engine-*.so``: build one by checking the other
sources out and loading the engine once); this side is ``--this`` or the
library this checkout loads.  ``--repeat N`` streams the sentences N times
over in each round, so that the rows stay full for most of it.  Host noise
that drifts over minutes falls on both builds alike, where two runs one after
the other can differ by more than the change being measured (compare_builds.py
does the same for single sentences, by the engine's loop).  As there, check
a null pair (a library against a copy of itself) and both orders of making
the sides' engines (``--first other``) before trusting a few percent.
"""
import argparse
import statistics
import sys
import time


def translator_on(lib, a):
    """A Translator whose engines run on ``lib``, its inputs, and each input's own translate(s)."""
    from fairseq_aggressive.diagnostics.loading import translator_and_lines
    from fairseq_aggressive.native import engine as native_engine

    before = native_engine.library
    native_engine.library = lambda isa=None: lib
    try:
        return translator_and_lines(a.model_dir, a.sentences_file, a.sentences, a.decoding, a.int8, a.threads)
    finally:
        native_engine.library = before


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("sentences_file")
    ap.add_argument("--other", required=True, help="the other build's engine library file")
    ap.add_argument("--this", default=None,
                    help="this side's engine library file (default: the one this checkout loads)")
    ap.add_argument("--rows", default="8,32,128")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2, help="the sentences this many times over in each round")
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--decoding", choices=["greedy", "iad"], default="greedy")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="the engine's threads (default: all CPUs)")
    ap.add_argument("--first", choices=["this", "other"], default="this", help="the side whose engines are made first")
    a = ap.parse_args(argv)
    rows = [int(x) for x in a.rows.split(",")]
    if a.rounds < 1 or a.repeat < 1 or any(r < 1 for r in rows):
        ap.error("--rounds, --repeat and --rows must be >= 1")

    from fairseq_aggressive.native import build
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    libs = {"this": build._load(a.this) if a.this else build.library(), "other": build._load(a.other)}
    if libs["this"]._name == libs["other"]._name:
        print(f"error: both sides load {libs['this']._name}: nothing to compare", file=sys.stderr)
        return 2
    order = ["this", "other"] if a.first == "this" else ["other", "this"]
    sides = {side: translator_on(libs[side], a) for side in order}
    lines, alone = sides["this"][1], sides["this"][2]
    if sides["other"][2] != alone:
        print("error: the builds translate the sentences differently", file=sys.stderr)
        return 1
    print(f"machine: {describe_machine(machine_info())}; {a.decoding}, {'int8' if a.int8 else 'float32'}; "
          f"{len(lines)} sentences x {a.repeat} a round; this: {libs['this']._name}; other: {libs['other']._name}; "
          f"engines made first: {a.first}'s")
    text = lines * a.repeat
    times = {(r, side): [] for r in rows for side in sides}
    for r in rows:  # warm-up: each side's lanes made, its draft policy measured
        for t, _, _ in sides.values():
            list(t.translate_batch(lines, rows=r))
    for rnd in range(a.rounds):
        for r in rows:
            for side in (["this", "other"] if rnd % 2 == 0 else ["other", "this"]):
                t0 = time.perf_counter()
                out = list(sides[side][0].translate_batch(text, rows=r))
                times[(r, side)].append(1000 * (time.perf_counter() - t0) / len(text))
                if out != alone * a.repeat:
                    print(f"error: {side} build, {r} rows: an output differs from translate(s)", file=sys.stderr)
                    return 1
    for r in rows:
        this, other = times[(r, "this")], times[(r, "other")]
        print(f"{r} rows: this build best {min(this):.3f}, median {statistics.median(this):.3f} ms a sentence; "
              f"the other best {min(other):.3f}, median {statistics.median(other):.3f}; this one "
              f"{statistics.median(other) / statistics.median(this):.3f}x as fast")
    return 0


if __name__ == "__main__":
    sys.exit(main())
