"""What the server decodes with: a model directory's hub model, its
:class:`~fairseq_aggressive.translator.Translator` settings, one queue and W
workers on one copy of the weights (:mod:`~fairseq_aggressive.serving.scheduler`).

Where the decoding runs on the native engine as source-copy drafting,
greedy search or a feature drafter's drafts (``--decoding iad``, ``--decoding
greedy``, ``--decoding feature-ar`` with a native drafter), each worker drives
a running batch (continuous batching, in-engine draft lengths); its engines
share the weights of the others.  Any other decoding decodes the queued
sentences in static batches through the Translator (one worker).  Either way
a sentence's output is ``Translator.translate(sentence)``'s, which is the hub
model's ``translate(sentence, beam=1, ...)``.
"""
import logging
import sys
import threading
import time
from typing import Callable, List, Optional

import numpy as np

from ..streaming import TooLong
from ..streaming.options import translator_settings
from ..translator import Translator, load_hub
from .errors import Overloaded, RequestError, ShuttingDown
from .metrics import decode_counters
from .scheduler import ContinuousWorker, EngineFault, Item, Request, StaticWorker, WorkQueue

logger = logging.getLogger("fairseq_aggressive")

# how long a thread may hold the GIL while another waits for it (s): a worker back from
# the engine waits for the HTTP side to let go of it before it can answer and start the
# next pass; Python's default of 5 ms is several passes of a small model
SWITCH_INTERVAL = 0.0005
# how often the supervisor looks for dead workers (s)
SUPERVISE_EVERY = 0.05
# a worker that dies more than this many times within RESTART_WINDOW seconds is not started again:
# the backend has failed (the server stops and exits non-zero)
MAX_RESTARTS, RESTART_WINDOW = 5, 60.0
# a sentence whose worker died this many times while holding it fails instead of being queued again
MAX_ATTEMPTS = 2
# distinct words whose BPE segmentation is remembered (subword-nmt keeps every one it meets)
BPE_CACHE_WORDS = 100_000


def serving_threads(workers: int) -> int:
    """Engine threads per worker by default: the CPUs this process may use, less
    one for the HTTP side (parsing, BPE, answers), shared by the workers.  An
    engine whose threads outnumber the free cores waits, at every product,
    for a thread the HTTP side displaced."""
    from ..runtime.threads import usable_cpus

    return max(1, (usable_cpus() - 1) // workers)


class BoundedCache(dict):
    """A dict that forgets its oldest entries beyond ``limit`` (BPE's word cache: a
    client sending endless distinct words must not grow the server's memory)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self._lock = threading.Lock()

    def __setitem__(self, key, value):
        with self._lock:
            while len(self) >= self.limit:
                super().pop(next(iter(self)), None)
            super().__setitem__(key, value)


def bound_bpe_cache(hub, limit: int = BPE_CACHE_WORDS) -> None:
    """Give the hub's subword-nmt BPE a word cache of at most ``limit`` words (other BPEs: nothing)."""
    inner = getattr(getattr(hub, "bpe", None), "bpe", None)
    if inner is not None and isinstance(getattr(inner, "cache", None), dict):
        inner.cache = BoundedCache(limit)


class DecodeBackend:
    """``model_dir`` as :meth:`Translator.from_pretrained` takes it, decoded by
    ``workers`` workers (each with ``native_threads`` engine threads) from one
    queue of at most ``max_queue`` waiting sentences; a sentence of more than
    ``max_input_tokens`` tokens after BPE is refused; a running batch holds at
    most ``max_batch`` sentences.  ``settings``: the Translator's (``decoding``,
    ``inference_precision``, ``max_draft_len``, ...); ``decoding="greedy"`` is
    greedy search on the engine's running batch (IAD with drafts of 0 tokens).

    A supervisor thread starts a worker again where one dies, queueing the
    sentences it held first; past ``MAX_RESTARTS`` deaths within
    ``RESTART_WINDOW`` seconds it gives up: :attr:`failed` is set and
    ``on_fatal()`` is called (the server stops)."""

    def __init__(self, model_dir: str, workers: int = 1, max_queue: int = 256, max_input_tokens: int = 256,
                 max_batch: int = 32, metrics=None, on_fatal: Optional[Callable[[], None]] = None, **settings):
        if workers < 1 or max_batch < 1 or max_queue < 0 or max_input_tokens < 1:
            raise ValueError("--workers, --max-batch and --max-input-tokens must be >= 1, --max-queue >= 0")
        self.ready = False
        self.metrics = metrics
        self.closing = False
        self.failed = False
        self.on_fatal = on_fatal
        self.restarts: List[float] = []
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        settings = dict(settings)
        if settings.get("native_threads") in (None, "auto"):
            settings["native_threads"] = serving_threads(workers)
        decoding = settings.get("decoding", "iad")
        settings = translator_settings(settings)
        hub = load_hub(model_dir)
        bound_bpe_cache(hub)
        self.translator = Translator(hub, **settings)
        self.hub = hub
        limit = self.translator._limit
        self.max_input_tokens = min(max_input_tokens, limit) if limit is not None else max_input_tokens
        self.queue = WorkQueue(max_queue, on_length=self._queue_length,
                               on_dropped=lambda n: self.on_dropped(n, "queued"))
        # the same running batch as Translator.translate_batch's (streaming/decoder.py)
        self.continuous = self.translator.running_decoder()
        if self.continuous is not None:
            c = self.continuous
            self.workers = [ContinuousWorker(f"decoder-{i}", self.queue,
                                             lambda e=e: c.make_batch(*e), self._finish, max_batch, events=self)
                            for i, e in enumerate(c.engines(workers, settings.get("native_threads")))]
        else:
            logger.warning(f"--decoding {decoding}: decoded in static batches by one worker (a running batch takes "
                           "IAD and greedy search on the native engine)")
            self.workers = [StaticWorker("decoder-0", self.queue, self.translator.translate_static, max_batch,
                                         events=self)]
        self.mode = "continuous" if self.continuous is not None else "static"
        for w in self.workers:
            w.start()
        self._stop_supervisor = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()
        self._workers_gauge()
        if metrics is not None:
            metrics.set_decode_source(self.decode_counters)
        self.ready = True

    # ------------------------------------------------------------ requests
    def prepare(self, i: int, text: str):
        """Sentence ``i``'s tokens for a worker; a RequestError if it is too long."""
        words = len(text.split())
        if words + 1 > self.max_input_tokens:  # (every word gives a token or more; no BPE spent on it)
            raise RequestError(f"texts[{i}] has {words} words, so more than {self.max_input_tokens - 1} tokens "
                               f"after BPE; the limit is {self.max_input_tokens}", code="too_long", status=413)
        if self.continuous is None:
            n = int(self.translator.encode(text).numel())
            if n > self.max_input_tokens:
                raise RequestError(f"texts[{i}] is {n} tokens long after BPE; the limit is {self.max_input_tokens}",
                                   code="too_long", status=413)
            return None
        try:
            return self.continuous.prepare(text, self.max_input_tokens)
        except TooLong as e:
            raise RequestError(f"texts[{i}] {e}", code="too_long", status=413) from None

    def submit(self, texts: List[str], request_id: str = "") -> Request:
        """Queue ``texts``: the request's ``future`` resolves to their outputs in
        order; ``cancel(reason)`` drops what is left of it."""
        request = self.prepare_request(texts, request_id)
        self.enqueue(request)
        return request

    def prepare_request(self, texts: List[str], request_id: str = "") -> Request:
        """``texts`` tokenized and checked, not queued yet (:meth:`enqueue`)."""
        if self.closing:
            raise ShuttingDown("the server is shutting down")
        if self.queue.limit and len(texts) > self.queue.limit:
            raise RequestError(f"{len(texts)} texts in one request; at most {self.queue.limit} can ever wait "
                               "(--max-queue)", code="too_many_texts", status=413)
        request = Request(list(texts), request_id)
        request.items = [Item(request, i, self.prepare(i, t)) for i, t in enumerate(texts)]
        return request

    def enqueue(self, request: Request) -> None:
        """Queue a prepared request; Overloaded where its sentences would pass the queue's limit."""
        if self.closing:
            raise ShuttingDown("the server is shutting down")
        request.on_cancel = self._wake_all
        if not self.queue.put_all(request.items):
            raise Overloaded(f"the queue is full ({self.queue.limit} sentences wait); retry later")
        self._wake_all(only_with_room=True)

    def _wake_all(self, only_with_room: bool = False) -> None:
        """Make the running batches under way return at their next pass boundary (new
        sentences join, gone ones leave).  ``only_with_room``: only those that can
        take a sentence; an idle worker waits on the queue, which wakes it itself."""
        for w in self.workers:
            if not only_with_room or 0 < w.busy < w.max_batch:  # (a full batch takes nothing before one leaves)
                w.wake()

    def _finish(self, item: Item, tokens: List[int]) -> str:
        return self.continuous.finish(tokens)

    # ------------------------------------------------------------ health
    def alive(self) -> int:
        """Workers running now."""
        return sum(w.is_alive() for w in self.workers)

    def health(self) -> dict:
        """``status`` (``ok`` while a worker runs; ``loading``, ``shutting_down``,
        ``failed`` or ``no_workers`` otherwise), the workers alive and in all."""
        alive = self.alive()
        if self.closing:
            status = "shutting_down"
        elif not self.ready:
            status = "loading"
        elif self.failed:
            status = "failed"
        else:
            status = "ok" if alive else "no_workers"
        return {"status": status, "workers": alive, "workers_total": len(self.workers)}

    def _supervise(self) -> None:
        while not self._stop_supervisor.wait(SUPERVISE_EVERY):
            for i, w in enumerate(self.workers):
                if w.is_alive() or w.died is None or self.failed:
                    continue
                self._hand_back(w)
                now = time.monotonic()
                self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW] + [now]
                if self.metrics is not None:
                    self.metrics.observe_restart()
                if len(self.restarts) > MAX_RESTARTS:
                    self._fail(f"workers died {len(self.restarts)} times within {RESTART_WINDOW:g} s")
                    break
                logger.warning(f"{w.name} is started again ({len(self.restarts)} restart(s) within "
                               f"{RESTART_WINDOW:g} s)")
                self.workers[i] = w.respawn()
                self.workers[i].start()
            self._workers_gauge()

    def _hand_back(self, worker) -> None:
        """Queue again what a dead worker held (first), or fail what it held too often."""
        again = []
        for item in worker.held:
            if item.request.gone:
                continue
            item.attempts += 1
            if item.attempts >= MAX_ATTEMPTS:
                item.request.fail(EngineFault(f"sentence {item.index}: {item.attempts} workers died decoding it"))
            else:
                again.append(item)
        worker.held = []
        if again:
            self.queue.put_front(again)

    def _fail(self, why: str) -> None:
        self.failed = True
        logger.error(f"the backend has failed: {why}; no worker is started again")
        for item in self.queue.clear():
            item.request.fail(EngineFault("the backend has failed"))
        for w in self.workers:
            for item in list(w.held):
                item.request.fail(EngineFault("the backend has failed"))
        if self.on_fatal is not None:
            self.on_fatal()

    # ------------------------------------------------------------ events from the workers and the queue
    def on_dropped(self, n: int, where: str) -> None:
        """``n`` sentences of requests that are gone left the queue or the running batch undecoded."""
        if self.metrics is not None:
            self.metrics.observe_dropped(n, where)

    def on_fault(self, item: Item, error: BaseException) -> None:
        logger.error(f"request {item.request.id or '-'}: sentence {item.index} fails in the engine alone: {error}")
        if self.metrics is not None:
            self.metrics.observe_fault()

    def decode_counters(self) -> Optional[dict]:
        """The engine's counters since the start, summed over the workers (None: no running batch)."""
        if self.continuous is None:
            return None
        return decode_counters([st for w in self.workers for st in w.counters()])

    # ------------------------------------------------------------ metrics
    def _queue_length(self, n: int) -> None:
        if self.metrics is not None:
            self.metrics.set_queue_length(n)

    def _workers_gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.set_workers(self.alive())

    # ------------------------------------------------------------ shutdown
    def begin_drain(self) -> None:
        """Take nothing new (503 ``shutting_down``); what is queued or decoding goes on."""
        self.closing = True

    def close(self, timeout: float = 60.0) -> int:
        """Take nothing new, answer everything queued or decoding within
        ``timeout`` seconds in all, stop the workers; the sentences left
        unanswered (0 if none), whose requests then fail."""
        self.closing = True
        deadline = time.monotonic() + max(timeout, 0.0)
        for w in self.workers:
            w.stop_flag.set()
            w.wake()
        self.queue.wake()
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
        self._stop_supervisor.set()
        left = [it for it in self.queue.clear() if not it.request.gone]
        left += [it for w in self.workers for it in list(w.held) if not it.request.gone]
        for it in left:
            it.request.fail(ShuttingDown("the server stopped before this request was decoded"))
        self.ready = False
        return len(left)
