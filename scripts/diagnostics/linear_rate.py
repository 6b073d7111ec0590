#!/usr/bin/env python
"""How fast the engine's linear kernels run by rows per call, against the
core's own float32 arithmetic.

    python scripts/diagnostics/linear_rate.py [--dim 512] [--ffn 2048] [--vocab 10288]
        [--rows 1,2,4,5,6,8,9,12,16,20] [--threads 1 2] [--precision float32 int8] [--isa TARGET]
        [--load N] [--amx-min-rows R] [--decoder-layers L]

Builds ``linear_rate.cpp`` (beside this script; into the engine's cache, once) against ``csrc/cpu/linear.cpp`` (with ``linear_pack.cpp``,
``linear_amx.cpp`` and ``ops.cpp``) with the flags of the engine's target for this CPU (or ``--isa``) and times
``fa::linear`` on a decoder layer's shapes (self-attention q+k+v, an output
projection, the feed-forward pair, the vocabulary projection) at each row
count M, one call at a time, weights kept hot as far as the caches hold them.
Beside it, independent fused multiply-adds on the same threads give the peak
float32 rate (and, for int8, the rate of the int8 product instructions the
vector tiles use, two operations per product), the best of rounds taken before
and after the kernels' (a neighbour that takes the CPUs in one leaves the other).  Per shape and M: microseconds
per call, GFLOP/s (int8: two operations per product), the share of the float32
peak (int8: and of the int8 peak), and the call's time
against one row's: what a pass over M positions costs in its linear layers
against a one-token step.  ``--load N`` runs it beside N CPU-bound processes.  (An int8 product counts as two operations, as a
float32 one does; with VNNI int8 can pass 100% of the float32 peak.)  On an AMX
target, ``--amx-min-rows R`` sets the fewest rows an int8 product runs on AMX
tiles (fewer: VNNI tiles; the program is then built with the test library's
switches): run it with 1 and with a number above every ``--rows`` to see where
the tiles pay.  ``--decoder-layers L`` adds a row for a
decoder pass's products: L layers (q+k+v, three d x d products, the
feed-forward pair), each with its own weights, then the vocabulary, one after
another, so that the weights cycle through the caches as in a decode loop.
"""
import argparse
import os
import subprocess
import sys

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.native.build import choose_target, program
from fairseq_aggressive.native.machine import describe_machine
from fairseq_aggressive.native.targets import CSRC, TEST_DEFINE

HERE = os.path.dirname(os.path.abspath(__file__))


def flags(target, hooks=False):
    """The compiler flags of the timing program for the engine target ``target``; with ``hooks``, the test
    library's switches (``--amx-min-rows``)."""
    return ["-O3", "-std=c++17", "-pthread", "-ffp-contract=off", "-fno-math-errno", *target.cflags,
            *([TEST_DEFINE] if hooks else [])]


def build(isa, hooks=False):
    """The timing program for the engine target ``isa`` (compiled into the engine's cache once)."""
    target = choose_target(isa)
    sources = [os.path.join(HERE, "linear_rate.cpp"),
               *[os.path.join(CSRC, "cpu", unit) for unit in ("linear.cpp", "linear_pack.cpp", "linear_amx.cpp",
                                                               "ops.cpp")]]
    return target.name, program(f"linear_rate-{target.name}{'-hooks' if hooks else ''}", sources,
                                flags(target, hooks))


def report(exe: str, precision: str, threads: int, rows, shapes, amx_min_rows=None, decoder_layers=0) -> None:
    env = dict(os.environ)
    if amx_min_rows is not None:
        env["LINEAR_RATE_AMX_MIN_ROWS"] = str(amx_min_rows)
    if decoder_layers:  # each layer: q+k+v, out three times (self-attention's output, encoder-attention's
        # query and output), fc1, fc2; then the vocabulary
        names = list(shapes)
        layer = ",".join(str(names.index(n)) for n in ("q+k+v", "out", "out", "out", "fc1", "fc2"))
        env["LINEAR_RATE_PASS"] = f"{decoder_layers};{layer};{names.index('vocab')}"
    out = subprocess.run([exe, str(threads), precision, ",".join(map(str, rows)),
                          *[f"{n}:{k}" for n, k in shapes.values()]],
                         capture_output=True, text=True, check=True, env=env).stdout.split("\n")
    peak, peak8 = float(out[0].split()[1]), float(out[0].split()[2])
    times, passes = {}, {}
    for line in out[2:]:
        if line.startswith("pass "):
            _, m, us, mb = line.split()
            passes[int(m)] = float(us)
        elif line.strip():
            n, k, m, us, gf = line.split()
            times[(int(n), int(k), int(m))] = (float(us), float(gf))
    amx = out[1].split()[1]
    print(f"\n{precision}, {threads} thread(s): float32 fused multiply-add peak {peak:.0f} GFLOP/s; "
          + (f"int8 product peak (the vector tiles' instructions) {peak8:.0f} GOPS; " if peak8 else "")
          + f"AMX tiles: {amx}")
    print("| layer (N x K) | " + " | ".join(f"M={m}" for m in rows) + " |")
    print("|---|" + "---|" * len(rows))
    total = {m: 0.0 for m in rows}
    for name, (n, k) in shapes.items():
        one = times[(n, k, 1)][0]
        cells = []
        for m in rows:
            us, gf = times[(n, k, m)]
            total[m] += us
            share = f"{100 * gf / peak:.0f}%" + (f", {100 * gf / peak8:.0f}% int8" if peak8 else "")
            cells.append(f"{us:.{1 if us < 10 else 0}f} us, {gf:.0f} GF ({share}), {us / one:.2f}x")
        print(f"| {name} ({n} x {k}) | " + " | ".join(cells) + " |")
    print("| all five, against M=1 | " + " | ".join(f"{total[m]:.{1 if total[m] < 10 else 0}f} us, {total[m] / total[1]:.2f}x" for m in rows)
          + " |")
    if passes:
        print(f"| a decoder pass's products ({decoder_layers} layers, {float(mb):.3g} MB, one after another) | "
              + " | ".join(f"{passes[m]:.0f} us, {passes[m] / passes[1]:.2f}x" for m in rows) + " |")


def row_counts(text: str):
    """``--rows``: positive row counts, comma-separated."""
    try:
        rows = [int(m) for m in text.split(",")]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: row counts >= 1, comma-separated (e.g. 1,5,9)")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=None, help="default: 4 x --dim")
    ap.add_argument("--vocab", type=int, default=10288)
    ap.add_argument("--rows", type=row_counts, default="1,2,4,5,6,8,9,12,16,20")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--precision", choices=["float32", "int8"], nargs="+", default=["float32"])
    ap.add_argument("--isa", default=None, help="an engine target (default: the best this CPU runs)")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")
    ap.add_argument("--amx-min-rows", type=int, default=None,
                    help="AMX targets: the fewest rows an int8 product runs on AMX tiles")
    ap.add_argument("--decoder-layers", type=int, default=0,
                    help="also time a decoder pass's products: this many layers of their own weights and the "
                         "vocabulary, one after another, as a decode loop reads them")
    args = ap.parse_args(argv)
    C, F, V = args.dim, args.ffn or 4 * args.dim, args.vocab
    shapes = {"q+k+v": (3 * C, C), "out": (C, C), "fc1": (F, C), "fc2": (C, F), "vocab": (V, C)}
    rows = sorted(set([1] + args.rows))
    isa, exe = build(args.isa, hooks=args.amx_min_rows is not None)
    print(f"machine: {describe_machine()}; engine target {isa}; d={C}, ffn {F}, vocab {V}; "
          f"{args.load} CPU-bound processes beside it")
    with cpu_load(args.load):
        for precision in args.precision:
            for threads in args.threads:
                report(exe, precision, threads, rows, shapes, args.amx_min_rows, args.decoder_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
