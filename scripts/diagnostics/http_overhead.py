"""What HTTP costs: the server (``fairseq-aggressive-serve``, one process)
against the same decoders in process, side by side in one run, in
alternating rounds on the same sentences and engine threads.

- one request at a time over a keep-alive connection, against
  ``Translator.translate`` in process: p50 and p99 ms, and their ratio;
- capacity: C clients in a closed loop over HTTP, against C threads submitting
  to the same backend (``DecodeBackend``, as ``backend_load.py`` drives it) in
  process: sentences per second, and their ratio.

Every answer is checked against the in-process output.  ``--load N`` runs N
CPU-bound processes for the whole run (a machine doing other work).

    python scripts/diagnostics/http_overhead.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--sentences 300] [--rounds 3] [--clients 8] [--threads 1] [--load 2] [--json F]
"""
import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _busy(n):
    code = "import time\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _start_server(args):
    from fairseq_aggressive.serving.server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "fairseq_aggressive.serving.cli", args.model_dir, "--port", str(port),
           "--native-threads", str(args.threads), "--workers", str(args.workers), "--max-queue", "0",
           "--max-batch", str(args.max_batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    for line in proc.stdout:
        if "serving on" in line:
            break
    else:
        raise SystemExit("the server did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, port


async def _one_at_a_time(client, lines, outs):
    lat = []
    for s in lines:
        t0 = time.perf_counter()
        status, out = await client.translate(s, 60)
        lat.append(time.perf_counter() - t0)
        assert status == 200 and out == outs[s], (s, status, out)
    return lat


async def _http_capacity(port, lines, outs, clients):
    from fairseq_aggressive.bench.serve.client import HttpClient

    nxt = iter(range(len(lines)))

    async def one():
        c = HttpClient("127.0.0.1", port)
        for i in nxt:
            status, out = await c.translate(lines[i], 120)
            assert status == 200 and out == outs[lines[i]]
        await c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return len(lines) / (time.perf_counter() - t0)


def _inprocess_capacity(backend, lines, outs, clients):
    nxt, lock = iter(range(len(lines))), threading.Lock()

    def one():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            assert backend.submit([lines[i]]).future.result(120) == [outs[lines[i]]]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lines) / (time.perf_counter() - t0)


def main(argv=None):
    from fairseq_aggressive.bench.provenance import output_file
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("input", help="sentences, one a line")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients for capacity")
    p.add_argument("--threads", type=int, default=None,
                   help="engine threads per worker, both sides (default: the server's, the CPUs less one)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the run")
    p.add_argument("--json", type=output_file, help="write the figures here (scripts/results.py add stores them)")
    args = p.parse_args(argv)

    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    from fairseq_aggressive.bench.serve.client import HttpClient, percentile
    from fairseq_aggressive.serving.backend import DecodeBackend, serving_threads
    from fairseq_aggressive.translator import Translator

    args.threads = args.threads or serving_threads(args.workers)
    with open(args.input, encoding="utf-8") as f:
        lines = [x.strip() for x in f if x.strip()][:args.sentences]
    busy = _busy(args.load)
    proc, port = _start_server(args)
    try:
        backend = DecodeBackend(args.model_dir, workers=args.workers, native_threads=args.threads, max_queue=0,
                                max_batch=args.max_batch)
        logging.getLogger("fairseq_aggressive").setLevel(logging.WARNING)
        t = Translator(backend.hub, decoding="iad", native_threads=args.threads)
        outs = {s: t.translate_static([s])[0] for s in lines}
        http_lat, proc_lat, http_cap, proc_cap = [], [], [], []

        async def http_round():
            c = HttpClient("127.0.0.1", port)
            lat = await _one_at_a_time(c, lines, outs)
            await c.close()
            return lat

        asyncio.run(http_round())  # warm-up
        for _ in range(args.rounds):
            http_lat += asyncio.run(http_round())
            for s in lines:
                t0 = time.perf_counter()
                assert t.translate(s) == outs[s]
                proc_lat.append(time.perf_counter() - t0)
            http_cap.append(asyncio.run(_http_capacity(port, lines, outs, args.clients)))
            proc_cap.append(_inprocess_capacity(backend, lines, outs, args.clients))
        backend.close()
    finally:
        proc.terminate()
        proc.wait(30)
        for b in busy:
            b.kill()
    ms = lambda xs, q: 1000 * percentile(xs, q)  # noqa: E731
    http = {"p50_ms": ms(http_lat, 50), "p99_ms": ms(http_lat, 99), "capacity": statistics.median(http_cap)}
    inproc = {"p50_ms": ms(proc_lat, 50), "p99_ms": ms(proc_lat, 99), "capacity": statistics.median(proc_cap)}
    res = {"sentences": len(lines), "rounds": args.rounds, "threads": args.threads, "workers": args.workers,
           "clients": args.clients, "load": args.load, "systems": {"http": http, "in-process": inproc},
           "p50_ratio": http["p50_ms"] / inproc["p50_ms"], "capacity_ratio": http["capacity"] / inproc["capacity"]}
    print(f"{len(lines)} sentences x {args.rounds} rounds, {args.threads} engine thread(s), load {args.load}")
    print(f"one at a time: HTTP p50 {http['p50_ms']:.2f} ms (p99 {http['p99_ms']:.2f}), Translator in "
          f"process p50 {inproc['p50_ms']:.2f} ms (p99 {inproc['p99_ms']:.2f}): {res['p50_ratio']:.3f}x")
    print(f"capacity, {args.clients} clients: HTTP {http['capacity']:.0f} sentences/s, in process "
          f"{inproc['capacity']:.0f} sentences/s: {res['capacity_ratio']:.3f}x")
    if args.json:
        from fairseq_aggressive.bench.provenance import write_result

        write_result(args.json, res, os.path.join("scripts", "diagnostics", os.path.basename(__file__)))


if __name__ == "__main__":
    main()
