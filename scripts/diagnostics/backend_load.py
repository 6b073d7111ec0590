"""The server's decoders without HTTP: the serving backend (one worker's
running batch) driven in process, to tell what the engine gives from what
HTTP, JSON and BPE around it cost.

- ``closed``: N client threads, each submitting one sentence and waiting for
  its answer, the modes in alternating rounds (sentences per second, p99 ms);
- ``full``: every sentence queued at once, the running batch kept full
  (sentences per second, rows per pass, ms per pass), beside static batches of
  ``--max-batch`` through the Translator.

Every mode's outputs are checked against greedy's.

    python scripts/diagnostics/backend_load.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--clients 8] [--rounds 4] [--threads 1] [--load 2]
"""
import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MODES = {"iad": {}, "greedy": dict(decoding="greedy"), "iad-fixed": dict(draft_cost="off")}


def closed_loop(backend, lines, clients, requests):
    """(sentences per second, p99 ms, outputs by line index) with ``clients`` threads in a closed loop."""
    nxt, lock, lat, outs = [0], threading.Lock(), [], {}

    def client(_):
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= requests:
                return
            start = time.perf_counter()
            out = backend.submit([lines[i % len(lines)]]).future.result(120)
            lat.append(time.perf_counter() - start)
            outs[i % len(lines)] = out[0]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))  # (a client's error is raised here)
    lat.sort()
    return requests / (time.perf_counter() - start), 1000 * lat[int(0.99 * (len(lat) - 1))], outs


def full(backend, lines):
    """(sentences per second, rows per pass, ms per pass, outputs) with every sentence queued at once."""
    before = backend.workers[0].batch.stats()
    start = time.perf_counter()
    futures = [backend.submit([s]).future for s in lines]
    outs = [f.result(300)[0] for f in futures]
    seconds = time.perf_counter() - start
    after = backend.workers[0].batch.stats()
    passes = after.passes - before.passes
    rows = after.sentence_passes - before.sentence_passes
    return len(lines) / seconds, rows / max(passes, 1), 1000 * seconds / max(passes, 1), outs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("sentences")
    p.add_argument("--max-sentences", type=int, default=300)
    p.add_argument("--modes", default="iad,greedy,iad-fixed", help=f"of {', '.join(MODES)}")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=600, help="requests per closed-loop round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="engine threads (the server's default on 2 CPUs: 1)")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--load", type=int, default=0, help="beside N CPU-bound processes")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes) or "greedy" not in modes:
        raise SystemExit(f"--modes: of {', '.join(MODES)}, greedy among them")
    if min(args.clients, args.requests, args.rounds, args.threads, args.max_batch, args.max_sentences) < 1:
        raise SystemExit("--clients, --requests, --rounds, --threads, --max-batch, --max-sentences must be >= 1")

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.native.machine import describe_machine
    from fairseq_aggressive.serving.backend import DecodeBackend

    with open(args.sentences, encoding="utf-8") as f:
        lines = [ln.strip() for ln, _ in zip(f, range(args.max_sentences))]
    backends = {m: DecodeBackend(args.model_dir, native_threads=args.threads, max_queue=0, max_batch=args.max_batch,
                                 **MODES[m]) for m in modes}
    print(f"machine: {describe_machine()}; {len(lines)} sentences, engine threads {args.threads}, "
          f"max batch {args.max_batch}, load {args.load}")
    rates, p99s, outputs, filled = {m: [] for m in modes}, {m: [] for m in modes}, {m: {} for m in modes}, {}
    with cpu_load(args.load):
        for _ in range(args.rounds):
            for m in modes:
                rate, p99, outs = closed_loop(backends[m], lines, args.clients, args.requests)
                rates[m].append(rate)
                p99s[m].append(p99)
                outputs[m].update(outs)
        for m in modes:
            filled[m] = full(backends[m], lines)
        start = time.perf_counter()
        static = [o for i in range(0, len(lines), args.max_batch)
                  for o in backends["greedy"].translator.translate_static(lines[i:i + args.max_batch])]
        static_rate = len(lines) / (time.perf_counter() - start)
    for b in backends.values():
        b.close()
    greedy_rate = statistics.median(rates["greedy"])
    print(f"\n{args.clients} closed-loop clients, {args.requests} requests a round, {args.rounds} alternating rounds:")
    print("| mode | sent/s (median) | x greedy | rounds | p99 ms (median) |\n|---|---|---|---|---|")
    for m in modes:
        r = statistics.median(rates[m])
        print(f"| {m} | {r:.0f} | {r / greedy_rate:.2f}x | {', '.join(f'{x:.0f}' for x in rates[m])} | "
              f"{statistics.median(p99s[m]):.1f} |")
    print("\nevery sentence queued at once (a running batch kept full):")
    print("| mode | sent/s | rows per pass | ms per pass |\n|---|---|---|---|")
    for m in modes:
        r, rows, ms, _ = filled[m]
        print(f"| {m} | {r:.0f} | {rows:.1f} | {ms:.3f} |")
    print(f"| static batches of {args.max_batch}, greedy | {static_rate:.0f} | | |")
    reference = filled["greedy"][3]
    bad = sum(outputs[m][i] != reference[i] for m in modes for i in outputs[m])
    bad += sum(filled[m][3][i] != reference[i] for m in modes for i in range(len(lines)))
    bad += sum(a != b for a, b in zip(static, reference))
    print(f"\noutputs different from greedy's: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
