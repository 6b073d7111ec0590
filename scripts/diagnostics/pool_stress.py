#!/usr/bin/env python
"""Stress the native engine's thread pool (``fairseq_aggressive/native/csrc/pool/parallel.h``).

    python scripts/diagnostics/pool_stress.py [--variant plain|faults|split-bound]
        [--calls 10000000] [--threads 2 3 8] [--load 0 2] [--max-items 24] [--timeout-ms 2000]

Builds ``pool_stress.cpp`` (beside this script) against the pool with the
system C++ compiler and runs it once per thread count and load: one caller
makes CALLS calls, each of an item count drawn anew in [1, MAX_ITEMS] and
items of varying work, every call offered to the workers, and checks that
every item of every call ran exactly once.  ``--load N`` runs it beside N
CPU-bound processes.  Variants:

- ``plain``: the pool as the engine builds it;
- ``faults``: every window between two atomic steps of the protocol widened
  with yields and sleeps (``-DFA_POOL_FAULTS``);
- ``split-bound``: ``faults`` on a protocol that reads a job's bound apart from
  its job word (``-DFA_POOL_SPLIT_BOUND``), which loses or double-counts
  completions: the run must fail, showing that the stress test catches that
  class of bug.

Prints a line per run and, with ``--json``, one JSON object with every run
(threads, load, calls, bad items, exit status: 0 right, 1 miscounted item,
2 the pool reported a lost completion, 3 a hang the pool did not report,
negative: killed by that signal).
Exits 0 when every run's status is the one its variant expects.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from fairseq_aggressive.native.machine import describe_machine
from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.native.build import program

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = {"plain": ["-DFA_TEST_HOOKS"], "faults": ["-DFA_TEST_HOOKS", "-DFA_POOL_FAULTS"],
            "split-bound": ["-DFA_TEST_HOOKS", "-DFA_POOL_FAULTS", "-DFA_POOL_SPLIT_BOUND"]}
STATUS = {0: "ok", 1: "miscounted items", 2: "lost completion reported", 3: "hang"}


def build(variant: str) -> str:
    """The stress driver compiled for ``variant`` (into the engine's cache, once); its path."""
    return program(f"pool_stress-{variant}", [os.path.join(HERE, "pool_stress.cpp")],
                   ["-O2", "-std=c++17", "-pthread", "-Wall", "-Wextra", *VARIANTS[variant]])


def run(exe: str, threads: int, calls: int, max_items: int, seed: int, timeout_ms: int, limit_s: float) -> dict:
    t0 = time.monotonic()
    try:
        p = subprocess.run([exe, str(threads), str(calls), str(max_items), str(seed), str(timeout_ms)],
                           capture_output=True, text=True, timeout=limit_s)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:  # the driver's watchdog should have ended it
        rc, out, err = 3, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), ""
    words = out.split()
    fields = dict(zip(words[::2], words[1::2]))
    return dict(threads=threads, status=rc, outcome=STATUS.get(rc, f"exit {rc}"),
                calls=int(fields.get("calls", 0)), bad=int(fields.get("bad", 0)),
                parallel=int(fields.get("parallel", 0)), worker_items=int(fields.get("worker_items", 0)),
                seconds=round(time.monotonic() - t0, 2), report=err.strip()[-600:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="plain")
    ap.add_argument("--calls", type=int, default=10_000_000)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 3, 8])
    ap.add_argument("--load", type=int, nargs="+", default=[0, 2], help="CPU-bound processes beside each run")
    ap.add_argument("--max-items", type=int, default=24)
    ap.add_argument("--timeout-ms", type=int, default=2000, help="the pool's no-progress check")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit-s", type=float, default=3600, help="wall-clock limit of one run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    expect_ok = args.variant != "split-bound"
    runs = []
    exe = build(args.variant)
    print(f"machine: {describe_machine()}; variant {args.variant}", file=sys.stderr)
    for load in args.load:
        with cpu_load(load):
            for threads in args.threads:
                r = run(exe, threads, args.calls, args.max_items, args.seed + threads, args.timeout_ms,
                        args.limit_s)
                r["load"] = load
                runs.append(r)
                print(f"{args.variant}: threads {threads}, load {load}: {r['outcome']} after {r['calls']:,} "
                      f"calls ({r['parallel']:,} parallel, {r['worker_items']:,} items on workers, "
                      f"{r['bad']} bad) in {r['seconds']} s", file=sys.stderr)
                if r["report"]:
                    print(f"  {r['report']}", file=sys.stderr)
    if args.json:
        print(json.dumps(dict(variant=args.variant, machine=describe_machine(), runs=runs)))
    good = all((r["status"] == 0) == expect_ok for r in runs)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
