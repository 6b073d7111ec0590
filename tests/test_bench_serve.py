"""fairseq-aggressive-bench-serve: its percentiles and Poisson schedules, the
batching window of the static and CTranslate2 servers, and the command itself
on a few sentences (every server's answers the engine's greedy output)."""
import asyncio
import importlib.util
import json
import math
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fairseq_aggressive.bench.serve.client import HttpClient, percentile, poisson_schedule
from fairseq_aggressive.bench.serve.window import WindowedQueue
from helpers import needs_native

MODEL = "models/uagec-9x3"
SENTENCES = "data/uagec-sample/test.tok.src"


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([7.0], 0) == percentile([7.0], 99) == 7.0
    xs = [5, 1, 4, 2, 3]  # order does not matter
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 5
    assert percentile(xs, 50) == 3 and percentile(xs, 25) == 2
    assert percentile(xs, 90) == pytest.approx(4.6)  # between ranks: linear
    assert percentile([10, 20], 99) == pytest.approx(19.9)
    rng = random.Random(3)
    for n in (2, 3, 10, 101):
        data = [rng.expovariate(1.0) for _ in range(n)]
        for q in (1, 50, 90, 99, 99.9):
            assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)), rel=1e-12)
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_poisson_schedule():
    rate, duration = 200.0, 50.0
    s = poisson_schedule(rate, duration, cap=10**6, seed=1)
    n = len(s)
    expected = rate * duration  # 10,000 arrivals, standard deviation 100
    assert abs(n - expected) < 4 * math.sqrt(expected)
    assert all(0 < t < duration for t in s)
    gaps = np.diff([0.0] + s)
    assert (gaps > 0).all()  # increasing
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps: CV 1
    # about as many arrivals in each second (Poisson counts: variance = mean)
    counts = np.bincount(np.floor(s).astype(int), minlength=int(duration))
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.5)
    assert poisson_schedule(rate, duration, 10**6, seed=1) == s  # reproducible
    assert poisson_schedule(rate, duration, 10**6, seed=2) != s
    assert len(poisson_schedule(rate, duration, cap=25, seed=1)) == 25
    assert poisson_schedule(rate, duration, cap=25, seed=1) == s[:25]
    assert poisson_schedule(0.001, 1.0, 100, seed=0) == []  # the first arrival comes after the end
    with pytest.raises(ValueError):
        poisson_schedule(0, 1.0, 10)


def test_batching_window():
    from fairseq_aggressive.serving.scheduler import Item, Request, WorkQueue

    q = WorkQueue(0)
    w = WindowedQueue(q, window=0.2)

    def put(n):
        r = Request(["x"] * n)
        now = time.perf_counter()
        q.put_all([Item(r, i, now) for i in range(n)])

    assert w.take(4, wait=0.01) == []  # nothing queued: the worker's own wait only
    put(1)
    late = threading.Timer(0.05, put, args=(2,))
    late.start()
    t0 = time.perf_counter()
    got = w.take(4, wait=0.01)
    waited = time.perf_counter() - t0
    late.join()
    assert len(got) == 3  # the one queued and the two within its window
    assert 0.15 <= waited < 1.0  # the window ran out: fewer than 4
    put(6)
    t0 = time.perf_counter()
    assert len(w.take(4, wait=0.01)) == 4  # a full batch at once, no waiting
    assert len(w.take(4, wait=0.01)) == 2  # first queued ~now: waits out its window
    assert time.perf_counter() - t0 >= 0.15
    old = Request(["x"])
    q.put_all([Item(old, 0, time.perf_counter() - 1.0)])  # queued long ago: its window has passed
    t0 = time.perf_counter()
    assert len(w.take(4, wait=0.01)) == 1 and time.perf_counter() - t0 < 0.1


def test_client_resends_on_a_closed_keep_alive_connection():
    # uvicorn closes idle keep-alive connections (after 5 s): a request that meets
    # such a close is sent again on a new connection, not counted as the server's failure
    async def main():
        served = []

        async def handle(reader, writer):  # answers one request per connection; closes on the next unanswered
            for k in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0]
                        .split(b":")[1])
                body = json.loads(await reader.readexactly(n))
                served.append(body["text"])
                if k == 1:
                    break
                out = json.dumps({"text": body["text"].upper()}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out))
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = HttpClient("127.0.0.1", server.sockets[0].getsockname()[1])
        first = await client.translate("a", timeout=5)
        second = await client.translate("b", timeout=5)  # the kept connection closes on it: sent again
        await client.close()
        server.close()
        return first, second, client.reconnects, served

    first, second, reconnects, served = asyncio.run(main())
    assert (first, second) == ((200, "A"), (200, "B"))
    assert reconnects == 1 and served == ["a", "b", "b"]


def _bench(tmp_path, *args, timeout=150):
    out = tmp_path / "serve.json"
    png = tmp_path / "serve.png"
    proc = subprocess.run([sys.executable, "-m", "fairseq_aggressive.bench.serve_bench", MODEL, SENTENCES,
                           "--duration", "1", "--rates", "0.5", "--clients", "2", "--json", str(out),
                           "--plot", str(png), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        res = json.load(f)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return proc.stdout, res


def _check_phases(r, n):
    assert "error" not in r, r.get("error")
    assert r["exit_code"] == 0
    lat = r["latency"]
    assert lat["ok"] == n and lat["errors"] == lat["refused"] == 0  # one request per sentence
    assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"]
    cap = r["capacity"]
    assert cap["ok"] > 0 and cap["errors"] == 0 and cap["sentences_per_s"] > 0 and cap["clients"] == 2
    (point,) = r["open_loop"]
    assert point["fraction"] == 0.5
    assert point["offered_per_s"] == pytest.approx(0.5 * cap["sentences_per_s"], rel=0.01)
    assert point["ok"] == point["arrivals"] > 0 and point["errors"] == 0
    assert point["p50_ms"] <= point["p99_ms"]


@pytest.mark.e2e  # (the bench end to end: three servers, each driven through every phase)
@pytest.mark.slow
@needs_native
def test_bench_serve_ours(tmp_path):
    stdout, res = _bench(tmp_path, "--sentences", "20", "--systems", "iad,greedy,static")
    assert list(res["systems"]) == ["iad", "greedy", "static"]
    assert res["settings"]["sentences"] == 20 and res["machine_line"]
    for name, r in res["systems"].items():
        _check_phases(r, 20)
        c = r["check"]
        assert c["sentences_equal"] == c["sentences"] == 20, c["examples"]
        assert c["responses_equal"] == c["responses"] > 20 and c["errors"] == c["refused"] == 0
        assert f"{name}: =greedy 20/20 sentences" in stdout
    for name in ("iad", "greedy"):  # the continuous-batching servers' own counters, by phase
        r = res["systems"][name]
        assert r["server_metrics"]["passes"] >= r["capacity"]["decoder"]["passes"] > 0
        assert r["latency"]["decoder"]["rows_per_pass"] == 1.0  # one request at a time
    assert "### decoder passes" in stdout
    assert res["systems"]["greedy"]["server_metrics"]["tokens_per_row_pass"] == 1.0  # no drafts
    for phase in ("### latency", "### capacity", "### open loop"):
        assert phase in stdout
    assert "| static | 0.5 |" in stdout


@needs_native
@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 is not installed")
@pytest.mark.e2e  # (the bench end to end, with CTranslate2's server)
@pytest.mark.slow
def test_bench_serve_ct2(tmp_path):
    # float32: CTranslate2's greedy is the engine's here, so the BPE, the length limit and
    # the BPE's removal in the CTranslate2 server are checked too
    stdout, res = _bench(tmp_path, "--sentences", "10", "--systems", "ct2", "--ct2-config", "float32:1")
    r = res["systems"]["ct2"]
    _check_phases(r, 10)
    assert r["ct2_config"]["compute_type"] == "float32" and r["ct2_config"]["threads"] == 1
    assert r["check"]["sentences_equal"] == 10 and r["check"]["errors"] == 0
    assert "ct2: =greedy 10/10 sentences" in stdout
    assert r["server_complaints"] == []  # among them: torch loaded in the CTranslate2 server
