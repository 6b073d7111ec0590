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
import asyncio
import importlib
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
SERVING_DIR = os.path.join(os.path.dirname(HERE), "serving")
SYSTEMS = ("iad", "greedy", "static", "ct2")
OURS = ("iad", "greedy", "static")  # a difference from greedy is an error
HOST = "127.0.0.1"
READY_TIMEOUT = 120.0  # s for a server to print "serving on"
STOP_TIMEOUT = 60.0  # s for a server to exit after SIGTERM
PROBE_SENTENCES = 40  # CTranslate2's configurations are timed on these, at batch 1
WARMUP = 3  # requests before the latency phase (checked, not timed)


# ---------------------------------------------------------------- numbers
def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0..100) of ``xs`` by linear interpolation between
    the closest ranks (numpy's default); None for no values."""
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def poisson_schedule(rate: float, duration: float, cap: int, seed: int = 0) -> List[float]:
    """Arrival times (s from the start, increasing) of a Poisson process of
    ``rate`` arrivals per second: exponential gaps, every arrival before
    ``duration``, at most ``cap`` of them; the same ``seed``, the same schedule."""
    if rate <= 0:
        raise ValueError(f"the arrival rate must be > 0, got {rate}")
    rng = random.Random(seed)
    out: List[float] = []
    t = 0.0
    while len(out) < cap:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append(t)
    return out


def length_cap(max_len_a: float, max_len_b: int, src_len: int, max_positions: int) -> int:
    """fairseq's output length limit (generator.length_cap, repeated here: the
    CTranslate2 server does not import the package)."""
    return min(int(max_len_a * src_len + max_len_b), max_positions - 1)


# ---------------------------------------------------------------- the servers of static and ct2
def _serving(name: str):
    """The module ``fairseq_aggressive.serving.NAME``.  Where this file runs as
    a script (the CTranslate2 server) it is loaded from its file under a package
    of its own, so that ``fairseq_aggressive/__init__`` (torch, fairseq) is not
    imported: the serving modules the window backend needs import neither."""
    if __package__:
        return importlib.import_module(f"fairseq_aggressive.serving.{name}")
    pkg = "_fa_serving"
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [SERVING_DIR]
        sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.{name}")


class WindowedQueue:
    """A :class:`~fairseq_aggressive.serving.scheduler.WorkQueue` as a
    ``StaticWorker`` reads it, with a batching window: ``take`` returns once
    ``n`` items are taken or ``window`` seconds have passed since the first of
    them was queued (its ``prepared`` is its queueing time, ``time.perf_counter()``)."""

    def __init__(self, queue, window: float):
        self.queue, self.window = queue, window

    def __len__(self) -> int:
        return len(self.queue)

    def empty(self) -> bool:
        return self.queue.empty()

    def take(self, n: int, wait: float) -> list:
        items = self.queue.take(n, wait)
        if not items or self.window <= 0:
            return items
        deadline = items[0].prepared + self.window
        while len(items) < n:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            items += self.queue.take(n - len(items), wait=left)
        return items


def BatchingWindowWorker(name: str, queue, translate_batch: Callable, max_batch: int, window: float):
    """A ``StaticWorker`` (serving.scheduler, unchanged) that decodes batches of
    at most ``max_batch`` sentences collected within ``window`` seconds of the
    first one's arrival (:class:`WindowedQueue`)."""
    return _serving("scheduler").StaticWorker(name, WindowedQueue(queue, window), translate_batch, max_batch)


class WindowBackend:
    """The backend contract of ``serving.app.build_app`` (``ready``,
    ``submit(texts)`` -> Future of the outputs, ``close(timeout)``) over one
    queue and a :func:`BatchingWindowWorker` per ``translate_batch`` callable."""

    def __init__(self, translate_batches: Sequence[Callable], max_batch: int, window: float, max_queue: int = 256):
        sched = _serving("scheduler")
        self._sched, self._errors = sched, _serving("errors")
        self.ready = False
        self.closing = False
        self.queue = sched.WorkQueue(max_queue)
        self.workers = [BatchingWindowWorker(f"decoder-{i}", self.queue, tb, max_batch, window)
                        for i, tb in enumerate(translate_batches)]
        for w in self.workers:
            w.start()
        self.ready = True

    def submit(self, texts: List[str]):
        if self.closing:
            raise self._errors.ShuttingDown("the server is shutting down")
        request = self._sched.Request(list(texts))
        now = time.perf_counter()
        items = [self._sched.Item(request, i, now) for i in range(len(texts))]
        if not self.queue.put_all(items):
            raise self._errors.Overloaded(f"the queue is full ({self.queue.limit} sentences wait); retry later")
        return request.future

    def close(self, timeout: float = 60.0) -> int:
        self.closing = True
        for w in self.workers:
            w.stop_flag.set()
        for w in self.workers:
            w.join(timeout)
        self.ready = False
        return len(self.queue) + sum(w.busy for w in self.workers)


def _static_translators(args) -> List[Callable]:
    """The engine's greedy (IAD with drafts of 0 tokens), one Translator per
    worker on one hub model."""
    from fairseq_aggressive.translator import Translator

    settings = dict(decoding="iad", max_draft_len=0)
    if args.native_threads not in (None, "auto"):
        settings["native_threads"] = int(args.native_threads)
    first = Translator.from_pretrained(args.model_dir, **settings)
    return [first.translate_batch] + [Translator(first.hub, **settings).translate_batch
                                      for _ in range(args.workers - 1)]


def _ct2_translators(args) -> List[Callable]:
    """CTranslate2 greedy with the hub's BPE, as bench/ct2_worker.py's
    ``translate`` calls it (source tokens without EOS, beam 1, fairseq's length
    limit as ``max_decoding_length``), one callable per worker on one
    translator with ``inter_threads=workers``."""
    import ctranslate2
    from subword_nmt import apply_bpe

    # fairseq's subword_nmt BPE, built as fairseq/data/encoders/subword_nmt_bpe.py builds it
    bpe_args = apply_bpe.create_parser().parse_args(
        ["--codes", os.path.join(args.model_dir, "bpe.codes"), "--separator", "@@"])
    bpe = apply_bpe.BPE(bpe_args.codes, bpe_args.merges, bpe_args.separator, None, bpe_args.glossaries)
    translator = ctranslate2.Translator(args.serve_ct2, device="cpu", compute_type=args.compute_type,
                                        inter_threads=args.workers, intra_threads=args.threads)

    def translate_batch(texts: List[str]) -> List[str]:
        tokens = [bpe.process_line(t).split() for t in texts]  # hub.encode's tokens, without its EOS
        caps = [length_cap(args.max_len_a, args.max_len_b, len(t) + 1, args.max_positions) for t in tokens]
        res = translator.translate_batch(tokens, beam_size=1, max_decoding_length=max(caps),
                                         min_decoding_length=1, return_scores=False)
        # greedy is prefix-stable: a sentence's own cap is a cut of the batch's
        # hub.decode: the dictionary's string, then the BPE removed
        return [(" ".join(r.hypotheses[0][:cap]) + " ").replace("@@ ", "").rstrip() for r, cap in zip(res, caps)]

    return [translate_batch] * args.workers


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serve_bench.py --serve-static|--serve-ct2",
                                description="a batching-window server for fairseq-aggressive-bench-serve")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve-static", metavar="MODEL_DIR", help="the engine's greedy in static batches")
    mode.add_argument("--serve-ct2", metavar="CT2_MODEL_DIR", help="CTranslate2 greedy (needs --model-dir)")
    p.add_argument("--model-dir", help="--serve-ct2: the model directory of bpe.codes")
    p.add_argument("--host", default=HOST)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--window-ms", type=float, default=2.0)
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--native-threads", default="auto")
    p.add_argument("--compute-type", default="float32", help="--serve-ct2: CTranslate2's compute type")
    p.add_argument("--threads", type=int, default=1, help="--serve-ct2: CTranslate2's threads per worker")
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--max-positions", type=int, default=1024)
    return p


def serve_main(argv: List[str]) -> int:
    args = serve_parser().parse_args(argv)
    if args.serve_static:
        args.model_dir = args.serve_static
        translators = _static_translators(args)
        what = f"static batches of the engine's greedy, {args.model_dir}"
    else:
        if not args.model_dir:
            raise SystemExit("--serve-ct2 needs --model-dir (its bpe.codes)")
        translators = _ct2_translators(args)
        what = f"CTranslate2 {args.compute_type} x {args.threads} thread(s), {args.serve_ct2}"
    app_mod, metrics_mod, server_mod = _serving("app"), _serving("metrics"), _serving("server")
    if args.serve_ct2 and "torch" in sys.modules:  # its OpenMP runtime slows CTranslate2's
        print("WARNING: torch is loaded in the CTranslate2 server", flush=True)
    backend = WindowBackend(translators, args.max_batch, args.window_ms / 1000.0, args.max_queue)
    metrics = metrics_mod.ServiceMetrics()
    print(f"model {what}: {len(backend.workers)} worker(s), batches of <= {args.max_batch} within "
          f"{args.window_ms:g} ms", flush=True)
    app = app_mod.build_app(backend, metrics)

    def on_shutdown():
        left = backend.close(STOP_TIMEOUT)
        print(f"stopped: {left} sentence(s) unanswered", flush=True)

    return server_mod.run_server(app, args.host, args.port, on_shutdown)


# ---------------------------------------------------------------- the client
class _Unanswered(ConnectionError):
    """The connection closed before any byte of an answer."""


class HttpClient:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams (one connection
    per request in flight, reused), cheap enough beside the servers it loads.

    uvicorn closes a connection idle for 5 s (its ``timeout_keep_alive``): a
    connection idle for more than :attr:`MAX_IDLE` s is not reused, and a
    request on a reused connection that the server closed before answering
    anything is sent again once on a new connection (as HTTP clients do)."""

    MAX_IDLE = 2.0

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.idle: List = []  # (reader, writer, idle since)
        self.reconnects = 0  # requests sent again after a reused connection was closed

    async def request(self, method: str, path: str, payload=None, timeout: float = 60.0):
        """(status, body bytes)."""
        return await asyncio.wait_for(self._request(method, path, payload), timeout)

    def _reusable(self):
        now = time.perf_counter()
        while self.idle:
            reader, writer, since = self.idle.pop()
            if now - since <= self.MAX_IDLE and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _request(self, method, path, payload):
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        conn = self._reusable()
        if conn is not None:
            try:
                return await self._exchange(conn, head + body)
            except _Unanswered:
                self.reconnects += 1
        return await self._exchange(await asyncio.open_connection(self.host, self.port), head + body)

    async def _exchange(self, conn, data: bytes):
        reader, writer = conn
        try:
            writer.write(data)
            try:
                status_line = await reader.readline()
            except ConnectionError as e:
                raise _Unanswered(str(e)) from None
            if not status_line:
                raise _Unanswered("the server closed the connection")
            status = int(status_line.split()[1])
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if "content-length" not in headers:
                raise ConnectionError(f"no Content-Length in the answer ({headers})")
            data = await reader.readexactly(int(headers["content-length"]))
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer, time.perf_counter()))
        return status, data

    async def translate(self, text: str, timeout: float):
        """(status, output text or the error body)."""
        status, data = await self.request("POST", "/v1/translate", {"text": text}, timeout)
        obj = json.loads(data)
        return status, (obj["text"] if status == 200 else obj)

    async def close(self):
        for _, writer, _ in self.idle:
            writer.close()
        self.idle = []


QUEUE_FULL = "queue_full"  # the error code of a 503 for a full queue (load shed, not a failure)


class Checker:
    """Every answer against the reference: per sentence, whether all its answers
    equal it; answers refused for a full queue, and failed requests, counted apart."""

    def __init__(self, sentences: List[str], reference: List[str]):
        self.sentences, self.reference = sentences, reference
        self.seen: Dict[int, bool] = {}
        self.responses = self.equal = self.errors = self.refused = 0
        self.examples: List[Dict] = []

    def check(self, i: int, status: Optional[int], out) -> str:
        """``ok``, ``refused`` (503 queue_full) or ``failed``."""
        if status != 200:
            refused = status == 503 and isinstance(out, dict) and out.get("error", {}).get("code") == QUEUE_FULL
            if refused:
                self.refused += 1
            else:
                self.errors += 1
            if len(self.examples) < 5 and (not refused or self.refused == 1):
                self.examples.append({"sentence": i, "status": status, "error": out})
            return "refused" if refused else "failed"
        self.responses += 1
        same = out == self.reference[i]
        self.equal += same
        first_difference = not same and self.seen.get(i, True)
        self.seen[i] = self.seen.get(i, True) and same
        if first_difference and len(self.examples) < 5:
            self.examples.append({"sentence": i, "source": self.sentences[i], "got": out,
                                  "greedy": self.reference[i]})
        return "ok"

    def summary(self) -> Dict:
        return {"sentences_equal": sum(self.seen.values()), "sentences": len(self.seen),
                "responses_equal": self.equal, "responses": self.responses, "errors": self.errors,
                "refused": self.refused, "examples": self.examples}


class Tally:
    """One phase's outcomes: latencies of the answered requests (with their
    sentence), refused and failed counts, the time of the last answer."""

    def __init__(self, start: float):
        self.start = self.last = start
        self.lat: List[float] = []
        self.which: List[int] = []
        self.counts = {"ok": 0, "refused": 0, "failed": 0}

    def add(self, outcome: str, i: int, seconds: float) -> None:
        self.counts[outcome] += 1
        if outcome == "ok":
            self.lat.append(seconds)
            self.which.append(i)
        self.last = max(self.last, time.perf_counter())

    def stats(self, end: Optional[float] = None) -> Dict:
        seconds = (self.last if end is None else end) - self.start
        ms = [1000 * x for x in self.lat]
        r = lambda x: None if x is None else round(x, 3)  # noqa: E731
        c = self.counts
        slowest = sorted(zip(ms, self.which), reverse=True)[:5]
        return {"requests": sum(c.values()), "ok": c["ok"], "refused": c["refused"], "errors": c["failed"],
                "seconds": round(seconds, 3),
                "sentences_per_s": round(c["ok"] / seconds, 2) if seconds > 0 else None,
                "p50_ms": r(percentile(ms, 50)), "p90_ms": r(percentile(ms, 90)), "p99_ms": r(percentile(ms, 99)),
                "mean_ms": r(sum(ms) / len(ms)) if ms else None,
                "slowest": [{"sentence": i, "ms": round(x, 2)} for x, i in slowest]}


async def _one(client, checker, i, text, timeout) -> str:
    """One request, its answer checked: ``ok``, ``refused`` or ``failed``."""
    try:
        status, out = await client.translate(text, timeout)
    except Exception as e:  # noqa: BLE001  (a timeout, a broken connection: a failed request)
        return checker.check(i, None, f"{type(e).__name__}: {e}")
    return checker.check(i, status, out)


async def latency_phase(client, checker, sentences, duration, cap, timeout) -> Dict:
    """One request at a time over the sentences."""
    tally = Tally(time.perf_counter())
    for i, s in enumerate(sentences):
        if i >= cap or time.perf_counter() - tally.start >= duration:
            break
        t0 = time.perf_counter()
        outcome = await _one(client, checker, i, s, timeout)
        tally.add(outcome, i, time.perf_counter() - t0)
    return tally.stats(time.perf_counter())


async def capacity_phase(client, checker, sentences, clients, duration, cap, timeout) -> Dict:
    """``clients`` closed-loop clients, each sending the next sentence once its last is answered."""
    counter = itertools.count()
    tally = Tally(time.perf_counter())
    stop_at = tally.start + duration

    async def loop():
        while True:
            k = next(counter)
            if k >= cap or time.perf_counter() >= stop_at:
                return
            i = k % len(sentences)
            t0 = time.perf_counter()
            outcome = await _one(client, checker, i, sentences[i], timeout)
            tally.add(outcome, i, time.perf_counter() - t0)

    await asyncio.gather(*[loop() for _ in range(clients)])
    res = tally.stats()
    res["clients"] = clients
    return res


async def open_loop_phase(client, checker, sentences, rate, duration, cap, timeout, seed) -> Dict:
    """Poisson arrivals at ``rate`` per second; each request's latency runs from
    its scheduled arrival (a client that falls behind is counted against the server)."""
    schedule = poisson_schedule(rate, duration, cap, seed)
    tally = Tally(time.perf_counter() + 0.005)
    behind = []

    async def arrival(k, at):
        i = k % len(sentences)
        behind.append(time.perf_counter() - at)
        outcome = await _one(client, checker, i, sentences[i], timeout)
        tally.add(outcome, i, time.perf_counter() - at)

    tasks = []
    for k, offset in enumerate(schedule):
        at = tally.start + offset
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(arrival(k, at)))
    if tasks:
        await asyncio.wait(tasks)  # each request has its own timeout
    res = tally.stats()
    res.update(offered_per_s=round(rate, 2), arrivals=len(schedule),
               client_lag_p99_ms=round(1000 * percentile(behind, 99), 3) if behind else None)
    return res


def _counters(text: str) -> Dict[str, float]:
    """The decoder counters of a ``/metrics`` answer (the continuous-batching
    servers fill them; the others have requests and sentences only)."""
    vals: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            vals[name] = vals.get(name, 0.0) + float(value)
        except ValueError:
            pass
    out = {k: vals.get(f"fa_{k}_total", 0.0) for k in ("passes", "pass_rows", "pass_tokens", "sentences")}
    out["request_errors"] = sum(v for k, v in vals.items() if k.startswith("fa_request_errors_total"))
    out["passes_up_to_8_rows"] = vals.get('fa_batch_rows_bucket{le="8.0"}', 0.0)
    return out


def _decoder(before: Optional[Dict], after: Optional[Dict]) -> Optional[Dict]:
    """What the decoder did between two :func:`_counters`: passes, rows per pass,
    tokens a row emits per pass (1 without drafts), passes of more than 8 rows."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in after}
    out = {"passes": int(d["passes"]), "sentences": int(d["sentences"]), "request_errors": int(d["request_errors"])}
    if d["passes"]:
        out["rows_per_pass"] = round(d["pass_rows"] / d["passes"], 2)
        out["passes_over_8_rows"] = round(1 - d["passes_up_to_8_rows"] / d["passes"], 3)
    if d["pass_rows"]:
        out["tokens_per_row_pass"] = round(d["pass_tokens"] / d["pass_rows"], 3)
    return out


async def _snapshot(client) -> Optional[Dict]:
    try:
        status, data = await client.request("GET", "/metrics", timeout=10)
    except Exception:  # noqa: BLE001  (the metrics are extra: a phase does not fail for them)
        return None
    return _counters(data.decode()) if status == 200 else None


async def run_phases(port: int, sentences, reference, args, checker) -> Dict:
    client = HttpClient(HOST, port)
    timeout = max(60.0, 3 * args.duration)
    try:
        for i in range(min(WARMUP, len(sentences))):
            await _one(client, checker, i, sentences[i], timeout)
        first = snap = await _snapshot(client)

        async def phase(run):
            nonlocal snap
            res = await run
            now = await _snapshot(client)
            res["decoder"] = _decoder(snap, now)
            snap = now
            return res

        res = {"latency": await phase(latency_phase(client, checker, sentences, args.duration, args.requests_cap,
                                                    timeout))}
        cap = await phase(capacity_phase(client, checker, sentences, args.clients, args.duration,
                                         args.requests_cap, timeout))
        res["capacity"] = cap
        res["open_loop"] = []
        for k, f in enumerate(args.rates):
            if not cap["sentences_per_s"]:
                break
            point = await phase(open_loop_phase(client, checker, sentences, f * cap["sentences_per_s"],
                                                args.duration, args.requests_cap, timeout, seed=1000 + k))
            res["open_loop"].append(dict(fraction=f, **point))
        res["server_metrics"] = _decoder(first, snap)
        res["client_reconnects"] = client.reconnects
        return res
    finally:
        await client.close()


# ---------------------------------------------------------------- server processes
class ServerProcess:
    """A server subprocess: its output kept, ready once it prints ``serving on``."""

    def __init__(self, name: str, cmd: List[str], env: Optional[Dict] = None):
        self.name, self.cmd = name, cmd
        self.lines: List[str] = []
        self.port: Optional[int] = None
        self._ready = threading.Event()
        self.started = time.perf_counter()
        env = dict(env or os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "serving on http://" in line and not self._ready.is_set():
                self.port = int(line.strip().rsplit(":", 1)[1].strip("/"))
                self._ready.set()
        self._ready.set()  # exited

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        if not self._ready.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError(f"{self.name}: no 'serving on' line within {timeout:.0f} s "
                               f"(exit {self.proc.poll()}):\n" + "\n".join(self.lines[-30:]))
        return time.perf_counter() - self.started

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.lines.append(f"(killed: still running {STOP_TIMEOUT:.0f} s after SIGTERM)")
        self._reader.join(5)
        return self.proc.returncode

    def complaints(self) -> List[str]:
        """Log lines that look wrong (errors, tracebacks, warnings)."""
        keys = ("error", "traceback", "exception", "warning", "killed")
        return [ln for ln in self.lines if any(k in ln.lower() for k in keys)]


def server_command(system: str, args, port: int, ct2_dir=None, ct2_config=None, limits=None) -> List[str]:
    py = sys.executable
    threads = [] if args.native_threads in (None, "auto") else ["--native-threads", str(args.native_threads)]
    common = ["--host", HOST, "--port", str(port), "--max-batch", str(args.max_batch),
              "--workers", str(args.workers)]
    if system in ("iad", "greedy"):
        return ([py, "-m", "fairseq_aggressive.serving.cli", args.model_dir] + common
                + (["--decoding", "greedy"] if system == "greedy" else []) + threads)
    window = ["--window-ms", str(args.window_ms)]
    if system == "static":
        return [py, "-m", "fairseq_aggressive.bench.serve_bench", "--serve-static", args.model_dir] + common \
            + window + threads
    # run as a script: no torch in the CTranslate2 process
    return ([py, os.path.abspath(__file__), "--serve-ct2", ct2_dir, "--model-dir", args.model_dir] + common + window
            + ["--compute-type", ct2_config["compute_type"], "--threads", str(ct2_config["threads"]),
               "--max-len-a", str(limits["max_len_a"]), "--max-len-b", str(limits["max_len_b"]),
               "--max-positions", str(limits["max_positions"])])


# ---------------------------------------------------------------- report
def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def _cells(p: Dict) -> List[str]:
    return [str(p["ok"]), str(p["refused"]), str(p["errors"]), _fmt(p["p50_ms"], 2), _fmt(p["p90_ms"], 2),
            _fmt(p["p99_ms"], 2), _fmt(p["sentences_per_s"])]


def _row(cells: List[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def tables(result: Dict) -> str:
    systems = result["systems"]
    names = [s for s in result["settings"]["systems"] if s in systems and "error" not in systems[s]]
    bases = [b for b in ("greedy", "ct2") if b in names]
    out = []

    def header(first: List[str]) -> List[str]:
        cols = first + ["refused", "failed", "ms p50", "ms p90", "ms p99", "sent/s"] + [f"vs {b}" for b in bases]
        return [_row(cols), "|" + "|".join("---" for _ in cols) + "|"]

    out.append("### latency: one request at a time")
    out.append("(vs X: X's p50 / this p50; > 1: lower latency)")
    out += header(["system", "answered"])
    for s in names:
        p = systems[s]["latency"]
        out.append(_row([s] + _cells(p) + [_ratio(systems[b]["latency"]["p50_ms"], p["p50_ms"]) for b in bases]))
    out.append("")
    out.append(f"### capacity: {result['settings']['clients']} closed-loop clients")
    out.append("(vs X: this sent/s / X's; > 1: more sentences per second)")
    out += header(["system", "answered"])
    for s in names:
        p = systems[s]["capacity"]
        out.append(_row([s] + _cells(p) + [_ratio(p["sentences_per_s"], systems[b]["capacity"]["sentences_per_s"])
                                           for b in bases]))
    out.append("")
    out.append("### open loop: Poisson arrivals at a fraction of each system's own capacity")
    out.append("(vs X: X's p50 / this p50 at the same fraction; > 1: lower latency, at this system's offered rate)")
    out += header(["system", "load", "offered/s", "answered"])
    for k, f in enumerate(result["settings"]["rates"]):
        for s in names:
            pts = systems[s]["open_loop"]
            if k >= len(pts):
                continue
            p = pts[k]
            ratios = []
            for b in bases:
                bp = systems[b]["open_loop"]
                ratios.append(_ratio(bp[k]["p50_ms"], p["p50_ms"]) if k < len(bp) else "-")
            out.append(_row([s, f"{f:g}", _fmt(p["offered_per_s"])] + _cells(p) + ratios))
    decoders = [s for s in names if (systems[s].get("server_metrics") or {}).get("passes")]
    if decoders:
        out += ["", "### decoder passes of the continuous-batching servers, by phase (their /metrics)",
                "| system | phase | passes | rows/pass | passes > 8 rows | tokens per row-pass |",
                "|---|---|---|---|---|---|"]
        for s in decoders:
            r = systems[s]
            phases = [("latency", r["latency"]), ("capacity", r["capacity"])] + [
                (f"open {p['fraction']:g}", p) for p in r["open_loop"]]
            for label, p in phases:
                d = p.get("decoder") or {}
                if d.get("passes"):
                    out.append(f"| {s} | {label} | {d['passes']} | {d['rows_per_pass']:.2f} | "
                               f"{100 * d['passes_over_8_rows']:.1f}% | {d['tokens_per_row_pass']:.2f} |")
    return "\n".join(out)


def plot(result: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (name, r) in enumerate(result["systems"].items()):
        if "error" in r:
            continue
        # in the order of the load (open-loop points, then the closed loop): an
        # overloaded point (less throughput, more latency) shows as a hook back
        pts = [p for p in r["open_loop"] + [r["capacity"]] if p["sentences_per_s"] and p["p50_ms"] is not None]
        x = [p["sentences_per_s"] for p in pts]
        color = f"C{k}"
        ax.plot(x, [p["p50_ms"] for p in pts], "o-", color=color, label=f"{name} p50")
        ax.plot(x, [p["p99_ms"] for p in pts], "s--", color=color, label=f"{name} p99")
    ax.set_xlabel("throughput (sentences/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    s = result["settings"]
    ax.set_title(f"open loop at {', '.join(f'{f:g}' for f in s['rates'])} x capacity, and {s['clients']} "
                 f"closed-loop clients (last point)\nmax-batch {s['max_batch']}, {s['workers']} worker(s), "
                 f"load {s['bench_load']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- the bench
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
    root = os.path.dirname(os.path.dirname(HERE))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "changed": [ln[3:] for ln in changed if ln.strip()]} if commit else {}


def _quiet_logs():
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq_aggressive", "fairseq.tasks", "fairseq.models"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _reference(args, sentences):
    """The engine's greedy one sentence at a time, the length limits and the
    BPE tokens of the CTranslate2 probe."""
    from fairseq_aggressive.translator import Translator

    _quiet_logs()
    t = Translator.from_pretrained(args.model_dir, decoding="iad", max_draft_len=0)
    _quiet_logs()
    ref = [t.translate(s) for s in sentences]
    gen = t.generator
    limits = {"max_len_a": float(gen.max_len_a), "max_len_b": int(gen.max_len_b), "max_positions": int(gen.max_len)}
    d = t.hub.src_dict
    probe = []
    for s in sentences[:PROBE_SENTENCES]:
        ids = t.hub.encode(s).tolist()
        probe.append({"tokens": [[d[i] for i in ids[:-1]]],
                      "max_len": length_cap(limits["max_len_a"], limits["max_len_b"], len(ids),
                                            limits["max_positions"])})
    return ref, limits, probe


def _ct2_setup(args, probe, log) -> Dict:
    from fairseq_aggressive.bench import ct2
    from fairseq_aggressive.runtime.threads import usable_cpus

    ct2_dir = ct2.converted_model(os.path.join(args.model_dir, "model.pt"), args.model_dir)
    if args.ct2_config:
        ctype, _, th = args.ct2_config.partition(":")
        return {"dir": ct2_dir, "compute_type": ctype, "threads": int(th or 1), "tuned": False}
    cfg = ct2.tune(ct2_dir, probe, ct2.thread_counts(usable_cpus()), min(WARMUP, len(probe)))
    log(f"ct2: {cfg['compute_type']} x {cfg['threads']} thread(s), the fastest at batch 1 on {len(probe)} "
        "sentences of " + ", ".join(f"{c['compute_type']}/{c['threads']}t {1000 * c['seconds']:.0f} ms"
                                     for c in cfg["configs"]))
    return {"dir": ct2_dir, "compute_type": cfg["compute_type"], "threads": cfg["threads"], "tuned": True,
            "configs": cfg["configs"]}


def _machine_busy() -> Optional[float]:
    """CPU-seconds every CPU of the machine has been busy (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """CPU-seconds process ``pid`` has used (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def run_system(system, args, sentences, reference, ct2_setup, limits, log, load_pids=()) -> Dict:
    from fairseq_aggressive.serving.server import free_port

    checker = Checker(sentences, reference)
    cmd = server_command(system, args, free_port(HOST), ct2_setup and ct2_setup["dir"], ct2_setup, limits)
    env = None
    if system == "ct2":
        env = dict(os.environ, OMP_NUM_THREADS=str(ct2_setup["threads"] * args.workers))
    server = ServerProcess(system, cmd, env)
    res: Dict = {"command": " ".join(cmd)}
    try:
        res["ready_s"] = round(server.wait_ready(), 2)
        log(f"{system}: serving on port {server.port} after {res['ready_s']:.1f} s")
        pids = [server.proc.pid] + list(load_pids)
        before = (_machine_busy(), _own_cpu(), [_process_cpu(p) for p in pids], time.perf_counter())
        res.update(asyncio.run(run_phases(server.port, sentences, reference, args, checker)))
        after = (_machine_busy(), _own_cpu(), [_process_cpu(p) for p in pids], time.perf_counter())
        res["client_cpu_s"] = round(after[1] - before[1], 2)
        res["server_cpu_s"] = round(after[2][0] - before[2][0], 2)
        res["phases_s"] = round(after[3] - before[3], 2)
        if before[0] is not None:
            # CPU time on the machine that neither this process, its server nor its load used
            ours = res["client_cpu_s"] + sum(a - b for a, b in zip(after[2], before[2]))
            res["other_cpu_s"] = round(max(0.0, after[0] - before[0] - ours), 2)
    except Exception as e:  # noqa: BLE001  (reported; the other systems still run)
        res["error"] = str(e)
    finally:
        res["exit_code"] = server.stop()
        res["server_complaints"] = server.complaints()[-20:]
        res["server_log_tail"] = server.lines[-10:]
    res["check"] = checker.summary()
    if ct2_setup and system == "ct2":
        res["ct2_config"] = {k: v for k, v in ct2_setup.items() if k != "dir"}
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("--serve-static", "--serve-ct2"):
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
    reference, limits, probe = _reference(args, sentences)
    log(f"reference: the engine's greedy one sentence at a time, {len(sentences)} sentences in "
        f"{time.perf_counter() - t0:.1f} s")
    result = {"machine": machine, "machine_line": describe_machine(machine), "source": _provenance(),
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
                ct2_setup = _ct2_setup(args, probe, log)
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
            print(f"  warning: other processes used {r['other_cpu_s']} CPU-s during {system}'s phases: "
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


if __name__ == "__main__":
    cli_main()
