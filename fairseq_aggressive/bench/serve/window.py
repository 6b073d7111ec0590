"""The servers of the ``static`` and ``ct2`` systems (``serve_bench.py
--serve-static|--serve-ct2``): one queue, read by workers that decode what
arrives within a batching window of the first queued sentence, behind the
HTTP app of :mod:`fairseq_aggressive.serving`.  Neither this module nor
those it imports import torch or fairseq at the top: the CTranslate2 server
runs without them."""
import argparse
import importlib
import sys
import time
from typing import Callable, List, Sequence

from .ct2_server import ct2_translators
from .servers import HOST, STOP_TIMEOUT
from .static_server import static_translators

SERVE_MODES = ("--serve-static", "--serve-ct2")  # the first argument that makes the command a server

def _serving(name: str):
    """The module ``fairseq_aggressive.serving.NAME``.  Where ``serve_bench.py``
    runs as a script (the CTranslate2 server), this module and the serving
    modules are loaded from their files under packages of their own
    (``serve_bench.STANDALONE``: the latter as ``_fa_serving.NAME``), so that
    ``fairseq_aggressive/__init__`` (torch, fairseq) is not imported: the
    serving modules the window backend needs import neither."""
    package = "fairseq_aggressive.serving" if __name__.startswith("fairseq_aggressive.") else "_fa_serving"
    return importlib.import_module(f"{package}.{name}")


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
    """The backend contract of ``serving.app.build_app`` (``health()``,
    ``submit(texts, request_id)`` -> a request with the Future of its outputs, ``close(timeout)``) over one
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

    def submit(self, texts: List[str], request_id: str = ""):
        if self.closing:
            raise self._errors.ShuttingDown("the server is shutting down")
        request = self._sched.Request(list(texts), request_id)
        now = time.perf_counter()
        items = [self._sched.Item(request, i, now) for i in range(len(texts))]
        if not self.queue.put_all(items):
            raise self._errors.Overloaded(f"the queue is full ({self.queue.limit} sentences wait); retry later")
        return request

    def close(self, timeout: float = 60.0) -> int:
        self.closing = True
        for w in self.workers:
            w.stop_flag.set()
        for w in self.workers:
            w.join(timeout)
        self.ready = False
        return len(self.queue) + sum(w.busy for w in self.workers)

    def health(self) -> dict:
        alive = sum(w.is_alive() for w in self.workers)
        status = "loading" if not self.ready else "shutting_down" if self.closing else "ok" if alive else "no_workers"
        return {"status": status, "workers": alive, "workers_total": len(self.workers)}


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
        translators = static_translators(args)
        what = f"static batches of the engine's greedy, {args.model_dir}"
    else:
        if not args.model_dir:
            raise SystemExit("--serve-ct2 needs --model-dir (its bpe.codes)")
        translators = ct2_translators(args)
        what = f"CTranslate2 {args.compute_type} x {args.threads} thread(s), {args.serve_ct2}"
    app_mod, metrics_mod, server_mod = _serving("app"), _serving("metrics"), _serving("server")
    if args.serve_ct2 and "torch" in sys.modules:  # its OpenMP runtime slows CTranslate2's
        print("WARNING: torch is loaded in the CTranslate2 server", flush=True)
    backend = WindowBackend(translators, args.max_batch, args.window_ms / 1000.0, args.max_queue)
    metrics = metrics_mod.ServiceMetrics()
    print(f"model {what}: {len(backend.workers)} worker(s), batches of <= {args.max_batch} within "
          f"{args.window_ms:g} ms", flush=True)
    app = app_mod.build_app(backend, metrics)

    def on_shutdown(seconds_left):
        left = backend.close(STOP_TIMEOUT)
        print(f"stopped: {left} sentence(s) unanswered", flush=True)

    return server_mod.run_server(app, args.host, args.port, on_shutdown)
