"""The decoders behind the server: workers that take sentences from one
queue and decode them.

A :class:`ContinuousWorker` drives a running batch of the native engine
(:class:`~fairseq_aggressive.native.running.RunningBatch`): sentences that
arrive join it between passes (all that arrived together share one encoder
pass), each leaves at its EOS and its request is answered at once, and each
pass's draft lengths are chosen inside the engine from the pass cost against
the acceptance it expects.  Every sentence's output is its batch-1 greedy
output, whatever else is in the batch.

A :class:`StaticWorker` decodes what is queued as one batch with a
:class:`~fairseq_aggressive.translator.Translator` (decodings the running
batch does not run: GAD, blockwise, the torch path).

Faults.  A request whose client went away (:meth:`Request.cancel`) is skipped
in the queue and its decoding rows leave the batch at the next pass boundary.
When the engine fails, the sentences of the failed batch are decoded again,
each alone in a new batch: a sentence that fails alone fails its request
(:class:`EngineFault`), the others are answered as usual (a sentence's output
does not depend on its batch).  A worker that dies of anything else hands its
sentences back (:attr:`Worker.held`); the backend's supervisor queues them
again and starts a new worker in its place.
"""
import collections
import logging
import threading
from concurrent.futures import Future
from typing import Callable, List, Optional

logger = logging.getLogger("fairseq_aggressive")

# how long an idle worker waits on the queue before it looks at its stop flag (s)
IDLE_POLL = 0.05
# passes a running batch makes before the worker looks at its queue, if no sentence finished nor arrived
MAX_PASSES = 256
# with several sentences decoding, the least time (ms) between two returns to Python: each costs
# the worker the interpreter lock, which it shares with the HTTP side (a lone sentence returns at once)
RUN_MIN_MS = 1.0


class EngineFault(RuntimeError):
    """A sentence failed in the engine when decoded alone: its request fails (HTTP 500)."""


class Request:
    """One HTTP request's sentences: its future resolves to their outputs, in
    order, or to an error.  ``cancel(reason)`` (any thread) marks it gone: its
    sentences are not decoded any further.

    Its end (answered, failed, cancelled) is set once, under its lock, by
    whichever thread comes first; the others find it done and change nothing.
    ``gone`` is read without the lock: a stale answer only lets a sentence
    decode one more pass, or be answered into a request already ended, which
    ``done`` then ignores."""

    def __init__(self, texts: List[str], request_id: str = ""):
        self.texts = texts
        self.id = request_id
        self.outputs: List[Optional[str]] = [None] * len(texts)
        self.left = len(texts)
        self.future: Future = Future()
        self.cancelled: Optional[str] = None
        self.lock = threading.Lock()
        self.on_cancel: Optional[Callable[[], None]] = None
        self.items: list = []  # (the backend's, between preparing and queueing)

    @property
    def gone(self) -> bool:
        """Whether nothing more of it needs decoding (cancelled, answered or failed)."""
        return self.cancelled is not None or self.future.done()

    def start(self) -> bool:
        """Whether to decode it (False: its client went away, or it failed)."""
        return not self.gone

    def done(self, i: int, text: str) -> None:
        with self.lock:
            if self.outputs[i] is None:
                self.outputs[i] = text
                self.left -= 1
            finished = self.left == 0 and not self.future.done()
            if finished:
                self.future.set_result(self.outputs)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if not self.future.done():
                self.future.set_exception(error)

    def cancel(self, reason: str) -> bool:
        """Mark it gone (``client_closed``, ``timeout``); False if it was answered already."""
        with self.lock:
            if self.future.done() or self.cancelled is not None:
                return False
            self.cancelled = reason
            self.future.set_exception(RuntimeError(f"cancelled: {reason}"))
        if self.on_cancel is not None:
            self.on_cancel()
        return True


class Item:
    """Sentence ``index`` of ``request``, its source tokens prepared; ``attempts``:
    the workers that died holding it."""

    __slots__ = ("request", "index", "prepared", "attempts")

    def __init__(self, request: Request, index: int, prepared):
        self.request, self.index, self.prepared = request, index, prepared
        self.attempts = 0


class WorkQueue:
    """The sentences waiting for a worker, at most ``limit`` (0: no limit).
    Items of requests that are gone are dropped as they come up
    (``on_dropped(n)``)."""

    def __init__(self, limit: int, on_length: Optional[Callable[[int], None]] = None,
                 on_dropped: Optional[Callable[[int], None]] = None):
        self.limit = limit
        self._q: "collections.deque[Item]" = collections.deque()
        self._cond = threading.Condition()
        self.on_length, self.on_dropped = on_length, on_dropped

    def __len__(self) -> int:
        return len(self._q)

    def empty(self) -> bool:
        return not self._q

    def put_all(self, items: List[Item]) -> bool:
        """Queue them all, or none if they would pass the limit (False)."""
        with self._cond:
            if self.limit and len(self._q) + len(items) > self.limit:
                return False
            self._q.extend(items)
            self._cond.notify_all()
        self._length()
        return True

    def put_front(self, items: List[Item]) -> None:
        """Queue them first, whatever the limit (sentences a dead worker held)."""
        with self._cond:
            self._q.extendleft(reversed(items))
            self._cond.notify_all()
        self._length()

    def take(self, n: int, wait: float) -> List[Item]:
        """Up to n items: those queued now, or (none queued) those that come within ``wait`` seconds."""
        out: List[Item] = []
        dropped = 0
        if n <= 0:
            return out
        with self._cond:
            if not self._q and wait > 0:
                self._cond.wait(wait)
            while self._q and len(out) < n:
                it = self._q.popleft()
                if it.request.gone:
                    dropped += 1
                else:
                    out.append(it)
        if dropped and self.on_dropped is not None:
            self.on_dropped(dropped)
        if out or dropped:
            self._length()
        return out

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def clear(self) -> List[Item]:
        """Every item still queued, taken out (for a drain that ran out of time)."""
        with self._cond:
            items = list(self._q)
            self._q.clear()
        self._length()
        return items

    def _length(self) -> None:
        if self.on_length is not None:
            self.on_length(len(self._q))


class Worker(threading.Thread):
    """A decoding thread: ``held`` is what it has taken and not answered yet
    (handed back by the supervisor if it dies); ``died`` the exception it died of.
    Only the thread itself changes ``held``; the supervisor reads it once
    ``is_alive()`` is false, when the thread has returned and writes no more."""

    def __init__(self, name: str, source: WorkQueue, max_batch: int, events=None):
        super().__init__(name=name, daemon=True)
        self.source, self.max_batch = source, max_batch
        self.events = events  # on_dropped(n, where), on_fault(item, error)
        self.stop_flag = threading.Event()
        self.died: Optional[BaseException] = None
        self.held: List[Item] = []

    @property
    def busy(self) -> int:
        return len(self.held)

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001  (the supervisor restarts it)
            self.died = e
            logger.error(f"{self.name} died: {type(e).__name__}: {e}")

    def finished(self) -> bool:
        return self.stop_flag.is_set() and self.source.empty() and not self.held

    def _event(self, name: str, *args) -> None:
        fn = getattr(self.events, name, None) if self.events is not None else None
        if fn is not None:
            fn(*args)


class ContinuousWorker(Worker):
    """Decodes items from ``source`` in a running batch of at most ``max_batch``
    sentences.  ``make_batch()`` builds its running batch (on this worker's
    engine), ``finish(item, tokens)`` turns an output into text."""

    def __init__(self, name: str, source: WorkQueue, make_batch: Callable, finish: Callable, max_batch: int,
                 events=None):
        super().__init__(name, source, max_batch, events)
        self.make_batch, self.finish = make_batch, finish
        self.batch = None
        self.slots = {}  # slot -> item
        # the engine's counters: of the batches this worker (and those it replaced) dropped, and of
        # its batch after its last run.  Another thread (a metrics scrape) reads them: each is
        # a new object, made whole before one assignment publishes it, and never changed after,
        # so a reader sees the old snapshot or the new one, never a half-written one (the engine
        # itself is read by its driving thread only, between runs)
        self.retired: list = []
        self.snapshot = None

    def respawn(self) -> "ContinuousWorker":
        w = ContinuousWorker(self.name, self.source, self.make_batch, self.finish, self.max_batch, self.events)
        w.retired = [_summed(self.counters())]
        return w

    def counters(self) -> list:
        """The engine's counters of every batch so far, one entry each (``RunStats`` or summed dicts)."""
        snapshot = self.snapshot
        return self.retired + ([snapshot] if snapshot is not None else [])

    def _new_batch(self) -> None:
        if self.snapshot is not None:
            self.retired = [_summed(self.counters())]  # (one entry, however many batches went)
            self.snapshot = None
        self.batch = self.make_batch()

    def wake(self) -> None:
        batch = self.batch
        if batch is not None:
            batch.wake()

    def work(self) -> None:
        self._new_batch()
        while True:
            if not self.slots and self.finished():
                return
            items = self.source.take(self.max_batch - len(self.slots), wait=IDLE_POLL if not self.slots else 0.0)
            self.held.extend(items)
            try:
                if items:
                    self._join(items)
                self._drop_gone()
                if self.slots:
                    answers = self._outputs(self.batch.run(MAX_PASSES, RUN_MIN_MS if len(self.slots) > 1 else 0.0))
                    self._drop_gone()
                    self.snapshot = self.batch.stats()
                    # answered last: a client's answer goes out while this thread waits in C, not
                    # while it holds the interpreter lock for its bookkeeping
                    self._deliver(answers)
            except Exception as e:  # noqa: BLE001  the engine failed: its sentences are decoded again, alone
                self._isolate(e)

    def _join(self, items: List[Item]) -> None:
        p = [it.prepared for it in items]
        try:
            slots = self.batch.join([x.source for x in p], [x.copy for x in p], [x.max_len for x in p])
        except ValueError as e:  # arguments the engine refuses: these requests fail, the batch is as it was
            for it in items:
                it.request.fail(e)
                self.held.remove(it)
            return
        self.slots.update(zip(slots, items))

    def _outputs(self, finished: List[int]) -> list:
        """(item, text or the detokenizer's error) of the finished slots, which are free again."""
        out = []
        for slot in finished:
            item = self.slots.pop(slot)
            tokens, _, _ = self.batch.take(slot, item.prepared.max_len)
            self.held.remove(item)
            try:
                out.append((item, self.finish(item, tokens)))
            except Exception as e:  # noqa: BLE001  a detokenizer's failure fails its request alone
                out.append((item, e))
        return out

    @staticmethod
    def _deliver(answers: list) -> None:
        for item, text in answers:
            if isinstance(text, Exception):
                item.request.fail(text)
            else:
                item.request.done(item.index, text)

    def _answer(self, finished: List[int]) -> None:
        self._deliver(self._outputs(finished))

    def _drop_gone(self) -> None:
        gone = [slot for slot, item in self.slots.items() if item.request.gone]
        for slot in gone:
            self.batch.drop(slot)
            self.held.remove(self.slots.pop(slot))
        if gone:
            self._event("on_dropped", len(gone), "decoding")

    def _isolate(self, error: Exception) -> None:
        """Decode every held sentence again, each alone; fail those that fail alone."""
        logger.error(f"{self.name}: the engine failed with {len(self.held)} sentence(s) in its batch; each is "
                     f"decoded again alone: {error}")
        suspects = list(self.held)
        self.slots.clear()
        self._new_batch()
        for item in suspects:
            if item.request.gone:
                self.held.remove(item)
                self._event("on_dropped", 1, "decoding")
                continue
            try:
                self._join([item])
                while self.slots:
                    self._answer(self.batch.run(MAX_PASSES, 0.0))
                    self._drop_gone()
            except Exception as e:  # noqa: BLE001  pinned on this sentence
                self.slots.clear()
                if item in self.held:
                    self.held.remove(item)
                item.request.fail(EngineFault(f"the engine failed on sentence {item.index}: {e}"))
                self._event("on_fault", item, e)
                self._new_batch()
        self.snapshot = self.batch.stats()


def _summed(stats: list) -> dict:
    from .metrics import decode_counters

    return decode_counters(stats)


class StaticWorker(Worker):
    """Decodes what is queued (up to ``max_batch`` sentences) as one batch with
    ``translate_batch(texts)``, the batch after it once that is done."""

    def __init__(self, name: str, source: WorkQueue, translate_batch: Callable, max_batch: int, events=None):
        super().__init__(name, source, max_batch, events)
        self.translate_batch = translate_batch

    def respawn(self) -> "StaticWorker":
        return StaticWorker(self.name, self.source, self.translate_batch, self.max_batch, self.events)

    def wake(self) -> None:
        pass

    def work(self) -> None:
        while not self.finished():
            items = self.source.take(self.max_batch, wait=IDLE_POLL)
            if not items:
                continue
            self.held = list(items)
            try:
                outs = self.translate_batch([it.request.texts[it.index] for it in items])
                for it, o in zip(items, outs):
                    it.request.done(it.index, o)
            except Exception:  # noqa: BLE001  decoded again one by one: a failure is pinned on its sentence
                for it in items:
                    if it.request.gone:
                        continue
                    try:
                        it.request.done(it.index, self.translate_batch([it.request.texts[it.index]])[0])
                    except Exception as e:  # noqa: BLE001
                        it.request.fail(EngineFault(f"decoding failed on sentence {it.index}: {e}"))
                        self._event("on_fault", it, e)
            self.held = []
