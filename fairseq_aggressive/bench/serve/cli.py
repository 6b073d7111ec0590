"""``fairseq-aggressive-bench-serve MODEL_DIR SENTENCES``: the HTTP server
under loopback load, beside CTranslate2 behind the same batching window.

    fairseq-aggressive-bench-serve models/uagec-9x3 data/uagec-sample/test.tok.src \\
        --systems iad,greedy,static,ct2 --json work/serve/quiet.json --plot work/serve/quiet.png

Systems, each a server process on 127.0.0.1 answering ``POST /v1/translate``:

- ``iad``: ``fairseq-aggressive-serve`` as it ships (continuous batching,
  in-engine draft lengths);
- ``greedy``: the same with ``--decoding greedy`` (continuous batching, no drafts);
- ``static``: the engine's greedy in static batches: a worker takes what is
  queued, waits up to ``--window-ms`` after the first queued sentence for more
  (up to ``--max-batch``) and decodes them as one batch (``--serve-static``
  mode of this module);
- ``ct2``: CTranslate2 greedy at its fastest compute type and thread count on
  this machine (timed once at batch 1 on the first 40 sentences), behind the
  same batching window (``--serve-ct2`` mode, a process without torch).

Phases per system, each bounded by ``--duration`` seconds and
``--requests-cap`` requests: latency (one request at a time), capacity
(``--clients`` closed-loop clients) and open loop (Poisson arrivals at each of
``--rates`` times the system's own capacity).  Every request carries one
sentence; every answer is checked against the engine's greedy output one
sentence at a time (computed in this process): a difference for ``iad``,
``greedy`` or ``static``, or any failed request (an error answer, a timeout, a
broken connection) makes the exit status 1; CTranslate2's differences (int8
may differ) and requests refused for a full queue (503 ``queue_full``: the
server shedding load it cannot keep up with) are reported only.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Dict

from .phases import Checker
from .report import plot, tables
from .run import greedy_reference, run_system, setup_ct2
from .window import SERVE_MODES, serve_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SYSTEMS = ("iad", "greedy", "static", "ct2")
OURS = ("iad", "greedy", "static")  # a difference from greedy is an error


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-aggressive-bench-serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    p.add_argument("model_dir", help="a model directory: model.pt, dict.*.txt, bpe.codes, MODEL.json")
    p.add_argument("sentences_file", help="source sentences, one a line (as the model's input before BPE)")
    p.add_argument("--sentences", type=int, default=300, help="the first N lines (default 300)")
    p.add_argument("--systems", default="iad,greedy,static,ct2", help=f"of {', '.join(SYSTEMS)} (default all)")
    p.add_argument("--max-batch", type=int, default=32, help="sentences decoded at once (default 32)")
    p.add_argument("--workers", type=int, default=1, help="decoders per server (default 1)")
    p.add_argument("--native-threads", default="auto", help="engine threads per worker (default auto)")
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients of the capacity phase (default 8)")
    p.add_argument("--rates", default="0.3,0.5,0.7,0.9",
                   help="open-loop arrival rates as fractions of each system's capacity (default 0.3,0.5,0.7,0.9)")
    p.add_argument("--duration", type=float, default=10.0,
                   help="seconds per open-loop point, and a cap on every phase (default 10)")
    p.add_argument("--requests-cap", type=int, default=2000, help="most requests per phase (default 2000)")
    p.add_argument("--bench-load", type=int, default=0, help="CPU-bound processes beside the whole run (default 0)")
    p.add_argument("--window-ms", type=float, default=2.0,
                   help="static and ct2: the batching window after a batch's first sentence (default 2)")
    p.add_argument("--ct2-config", metavar="TYPE:THREADS",
                   help="CTranslate2's compute type and threads (default: the fastest, timed here)")
    p.add_argument("--json", metavar="OUT.json", help="write the results here")
    p.add_argument("--plot", metavar="OUT.png", help="latency against throughput, one line per system")
    return p


def _provenance() -> Dict:
    """The checkout's commit and its changed files (the engine is rebuilt from
    csrc/ as it is), where this runs from a git checkout."""
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "changed": [ln[3:] for ln in changed if ln.strip()]} if commit else {}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SERVE_MODES:
        return serve_main(argv)
    args = parser().parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise SystemExit(f"--systems: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(SYSTEMS)}")
    args.rates = [float(f) for f in args.rates.split(",") if f.strip()]
    if any(f <= 0 for f in args.rates):
        raise SystemExit("--rates: fractions of the capacity must be > 0")
    if args.clients < 1 or args.sentences < 1 or args.duration <= 0 or args.requests_cap < 1:
        raise SystemExit("--clients, --sentences and --requests-cap must be >= 1, --duration > 0")
    with open(args.sentences_file, encoding="utf-8") as f:
        sentences = [ln.strip() for ln in f if ln.strip()][: args.sentences]
    if not sentences:
        raise SystemExit(f"{args.sentences_file}: no sentences")

    def log(msg):
        print(msg, flush=True)

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    machine = machine_info()
    log(f"machine: {describe_machine(machine)}")
    t0 = time.perf_counter()
    reference, limits, probe = greedy_reference(args, sentences)
    log(f"reference: the engine's greedy one sentence at a time, {len(sentences)} sentences in "
        f"{time.perf_counter() - t0:.1f} s")
    source = _provenance()
    result = {"machine": machine, "machine_line": describe_machine(machine), "source": source,
              # the command and commit, as every benchmark's JSON names them (scripts/results.py)
              "command": " ".join(["fairseq-aggressive-bench-serve"] + [shlex.quote(a) for a in argv]),
              "commit": (source["commit"] + ("+dirty" if source["changed"] else "")) if source else None,
              "settings": {"model_dir": args.model_dir, "sentences_file": args.sentences_file,
                           "sentences": len(sentences), "systems": systems, "max_batch": args.max_batch,
                           "workers": args.workers, "native_threads": args.native_threads, "clients": args.clients,
                           "rates": args.rates, "duration": args.duration, "requests_cap": args.requests_cap,
                           "bench_load": args.bench_load, "window_ms": args.window_ms},
              "systems": {}}
    with cpu_load(args.bench_load) as load:
        ct2_setup = None
        if "ct2" in systems:
            try:
                ct2_setup = setup_ct2(args, probe, log)
            except Exception as e:  # noqa: BLE001
                result["systems"]["ct2"] = {"error": f"CTranslate2: {e}", "check": Checker([], []).summary()}
                systems = [s for s in systems if s != "ct2"]
        for system in systems:
            result["systems"][system] = run_system(system, args, sentences, reference, ct2_setup, limits, log,
                                                   [p.pid for p in load])
    result["systems"] = {s: result["systems"][s] for s in result["settings"]["systems"] if s in result["systems"]}

    print()
    print(f"machine: {result['machine_line']}")
    print(f"{len(sentences)} sentences, max-batch {args.max_batch}, {args.workers} worker(s), native threads "
          f"{args.native_threads}, window {args.window_ms:g} ms (static, ct2), {args.duration:g} s per phase, "
          f"load {args.bench_load}")
    src = result["source"]
    if src:
        changed = [f for f in src["changed"] if f.startswith("fairseq_aggressive/")]
        print(f"source: {src['commit']}" + (f" with changes to {', '.join(changed)}" if changed else ""))
    if ct2_setup:
        print(f"ct2: CTranslate2 {ct2_setup['compute_type']} x {ct2_setup['threads']} thread(s)"
              + (" (the fastest at batch 1 here)" if ct2_setup["tuned"] else " (--ct2-config)"))
    print()
    print(tables(result))
    print()
    failed = False
    for s, r in result["systems"].items():
        c = r["check"]
        line = (f"{s}: =greedy {c['sentences_equal']}/{c['sentences']} sentences "
                f"({c['responses_equal']}/{c['responses']} answers), {c['refused']} refused (503 queue full), "
                f"{c['errors']} failed request(s)")
        m = r.get("server_metrics") or {}
        if m.get("rows_per_pass"):
            line += f"; decoder: {m['rows_per_pass']} rows per pass, {m['tokens_per_row_pass']} tokens per row-pass"
        if r.get("client_reconnects"):
            line += f"; {r['client_reconnects']} request(s) sent again on a new connection (keep-alive closed)"
        if "client_cpu_s" in r:
            line += f"; CPU-s: server {r['server_cpu_s']}, client {r['client_cpu_s']}"
            if "other_cpu_s" in r:
                line += f", other processes {r['other_cpu_s']} (of {r['phases_s']:.0f} s x {os.cpu_count()} CPUs)"
        print(line)
        if r.get("other_cpu_s") and r["other_cpu_s"] > 0.05 * r["phases_s"] * (os.cpu_count() or 1):
            print(f"  warning: other processes used {r['other_cpu_s']} CPU-s during {s}'s phases: "
                  "the machine was not quiet")
        wrong = c["sentences_equal"] != c["sentences"] or c["responses_equal"] != c["responses"]
        if "error" in r:
            print(f"  error: {r['error']}")
        if r.get("exit_code") not in (0, None):
            print(f"  the server exited with {r['exit_code']}")
        for ln in r.get("server_complaints", []):
            print(f"  server: {ln}")
        for ex in c["examples"][:3]:
            print(f"  e.g. {json.dumps(ex, ensure_ascii=False)[:300]}")
        if s == "ct2" and wrong and not c["errors"]:
            print("  (CTranslate2 may differ from the engine's greedy: reported, not an error)")
        if "error" in r or c["errors"] or r.get("exit_code") not in (0, None) or (s in OURS and wrong):
            failed = True
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
        print(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    if failed:
        print("FAILED: a server failed or answered other than the engine's greedy (see above)")
    return 1 if failed else 0


def cli_main():
    sys.exit(main())
