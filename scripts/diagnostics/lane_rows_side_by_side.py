#!/usr/bin/env python
"""A stream's rows with each lane's bound (``NativeEngine.lane_rows``: as many
rows as keep their attention caches in the CPU's caches) against the same
stream with every lane holding its whole share of the rows, at each row count,
the two taking turns round by round (every other round in the reverse order)
in one process, every output checked against the sentence's own
``translate(s)``: whether the bound pays for this model on this machine now.

    python scripts/diagnostics/lane_rows_side_by_side.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--rows 32,64,128] [--rounds 4] [--repeat 2] [--sentences 300] [--int8] [--decoding greedy|iad]
        [--load N] [--bound N]

``--bound N`` holds the bound side's lanes to N rows instead of the engine's
bound (what another bound would give).  Prints the bound, and for each row count the median ms per sentence of each
way and their ratio; ``--load N`` beside N CPU-bound processes.
"""
import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("sentences_file")
    ap.add_argument("--rows", default="32,64,128")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="the sentences this many times over in each round")
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--decoding", choices=["greedy", "iad"], default="greedy")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")
    ap.add_argument("--bound", type=int, default=None, help="the bound side's rows a lane (default: the engine's)")
    a = ap.parse_args(argv)
    rows = [int(x) for x in a.rows.split(",")]
    bad_bound = a.bound is not None and a.bound < 1
    if a.rounds < 1 or a.repeat < 1 or a.sentences < 1 or any(r < 1 for r in rows) or bad_bound:
        ap.error("--rows, --rounds, --repeat, --sentences and --bound must be >= 1")

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.diagnostics.loading import translator_and_lines
    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.runtime.gc_pause import gc_paused
    from fairseq_aggressive.streaming import stream
    from fairseq_aggressive.streaming.decoder import RunningDecoder

    t, lines, alone = translator_and_lines(a.model_dir, a.sentences_file, a.sentences, a.decoding, a.int8)
    ways = {"bound": RunningDecoder.of(t), "unbound": RunningDecoder.of(t)}
    if ways["bound"] is None:
        print(f"error: --decoding {a.decoding} does not run in the engine's running batch here", file=sys.stderr)
        return 2
    ways["unbound"].lane_rows = lambda: None
    if a.bound is not None:
        ways["bound"].lane_rows = lambda: a.bound
    bound = ways["bound"].lane_rows()
    print(f"machine: {describe_machine(machine_info())}; {a.decoding}, {'int8' if a.int8 else 'float32'}; "
          f"{len(lines)} sentences x {a.repeat} a round; lanes: {ways['bound'].lanes(max(rows))}; "
          f"rows a lane at most: {bound if bound is not None else 'no bound'}; load {a.load}")
    text = lines * a.repeat
    times = {(r, w): [] for r in rows for w in ways}
    with cpu_load(a.load):
        for rnd in range(a.rounds + 1):  # the first round warms up (lanes made, the draft policy measured)
            for r in rows:
                for w in (list(ways) if rnd % 2 == 0 else list(ways)[::-1]):
                    t0 = time.perf_counter()
                    with gc_paused():
                        out = list(stream(t, text, r, decoder=ways[w]))
                    if rnd:
                        times[(r, w)].append(1000 * (time.perf_counter() - t0) / len(text))
                    if out != alone * a.repeat:
                        print(f"error: {w}, {r} rows: an output differs from translate(s)", file=sys.stderr)
                        return 1
    for r in rows:
        b, u = statistics.median(times[(r, "bound")]), statistics.median(times[(r, "unbound")])
        print(f"{r} rows: bound {b:.3f} ms a sentence, unbound {u:.3f}: the bound {u / b:.3f}x as fast")
    return 0


if __name__ == "__main__":
    sys.exit(main())
