"""The decoders behind the server: workers that take sentences from one
queue and decode them.

A :class:`ContinuousWorker` drives a running batch of the native engine
(:class:`~fairseq_aggressive.native.running.RunningBatch`): sentences that
arrive join it between passes (all that arrived together share one encoder
pass), each leaves at its EOS and its request is answered at once, and each
pass's draft lengths are chosen inside the engine from the pass cost against
the acceptance it expects (a lone sentence drafts long, a full batch falls
back toward greedy).  Every sentence's output is its batch-1 greedy output.

A :class:`StaticWorker` decodes what is queued as one batch with a
:class:`~fairseq_aggressive.translator.Translator` (decodings the running
batch does not run: GAD, feature-ar, blockwise, the torch path).
"""
import logging
import queue
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


class Request:
    """One HTTP request's sentences: its future resolves to their outputs, in order."""

    def __init__(self, texts: List[str]):
        self.texts = texts
        self.outputs: List[Optional[str]] = [None] * len(texts)
        self.left = len(texts)
        self.future: Future = Future()
        self.started = False
        self.lock = threading.Lock()

    def start(self) -> bool:
        """Whether to decode it (False: its client went away before)."""
        with self.lock:
            if not self.started:
                self.started = True
                return self.future.set_running_or_notify_cancel()
            return not self.future.done()

    def done(self, i: int, text: str) -> None:
        with self.lock:
            self.outputs[i] = text
            self.left -= 1
            finished = self.left == 0
        if finished and not self.future.done():
            self.future.set_result(self.outputs)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if not self.future.done():
                self.future.set_exception(error)


class Item:
    """Sentence ``index`` of ``request``, its source tokens prepared (:meth:`Prepared`)."""

    __slots__ = ("request", "index", "prepared")

    def __init__(self, request: Request, index: int, prepared):
        self.request, self.index, self.prepared = request, index, prepared


class ContinuousWorker(threading.Thread):
    """Decodes items from ``source`` (a :class:`WorkQueue`) in a running batch
    of at most ``max_batch`` sentences.  ``make_batch()`` builds its running
    batch (on this worker's engine), ``finish(item, tokens)`` turns an
    output into text, ``on_passes(stats_delta)`` reports each round's counters."""

    def __init__(self, name: str, source: "WorkQueue", make_batch: Callable, finish: Callable,
                 max_batch: int, on_passes: Optional[Callable] = None):
        super().__init__(name=name, daemon=True)
        self.source, self.make_batch, self.finish = source, make_batch, finish
        self.max_batch, self.on_passes = max_batch, on_passes
        self.batch = make_batch()
        self.slots = {}  # slot -> item
        self.stop_flag = threading.Event()
        self._last = None

    def wake(self) -> None:
        self.batch.wake()

    @property
    def busy(self) -> int:
        return len(self.slots)

    def run(self) -> None:
        while True:
            idle = not self.slots
            if idle and self.stop_flag.is_set() and self.source.empty():
                return
            items = self.source.take(self.max_batch - len(self.slots), wait=IDLE_POLL if idle else 0.0)
            items = [it for it in items if it.request.start()]
            try:
                if items:
                    self._join(items)
                if self.slots:
                    for slot in self.batch.run(MAX_PASSES, RUN_MIN_MS if len(self.slots) > 1 else 0.0):
                        item = self.slots.pop(slot)
                        tokens, _, _ = self.batch.take(slot, item.prepared.max_len)
                        try:
                            item.request.done(item.index, self.finish(item, tokens))
                        except Exception as e:  # a detokenizer's failure fails its request alone
                            item.request.fail(e)
                    self._report()
            except Exception as e:  # the engine failed: every sentence in the batch fails, a new batch starts
                logger.error(f"{self.name}: {e}")
                for item in list(self.slots.values()) + items:
                    item.request.fail(e)
                self.slots.clear()
                self.batch = self.make_batch()
                self._last = None

    def _join(self, items: List[Item]) -> None:
        p = [it.prepared for it in items]
        try:
            slots = self.batch.join([x.source for x in p], [x.copy for x in p], [x.max_len for x in p])
        except ValueError as e:
            for it in items:
                it.request.fail(e)
            return
        self.slots.update(zip(slots, items))

    def _report(self) -> None:
        if self.on_passes is None:
            return
        now = self.batch.stats()
        self.on_passes(now, self._last)
        self._last = now


class StaticWorker(threading.Thread):
    """Decodes what is queued (up to ``max_batch`` sentences) as one batch with
    ``translate_batch(texts)``, the batch after it once that is done."""

    def __init__(self, name: str, source: "WorkQueue", translate_batch: Callable, max_batch: int):
        super().__init__(name=name, daemon=True)
        self.source, self.translate_batch, self.max_batch = source, translate_batch, max_batch
        self.stop_flag = threading.Event()
        self.busy = 0

    def wake(self) -> None:
        pass

    def run(self) -> None:
        while True:
            if self.stop_flag.is_set() and self.source.empty():
                return
            items = [it for it in self.source.take(self.max_batch, wait=IDLE_POLL) if it.request.start()]
            if not items:
                continue
            self.busy = len(items)
            try:
                outs = self.translate_batch([it.request.texts[it.index] for it in items])
                for it, o in zip(items, outs):
                    it.request.done(it.index, o)
            except Exception as e:
                for it in items:
                    it.request.fail(e)
            self.busy = 0


class WorkQueue:
    """The sentences waiting for a worker, at most ``limit`` (0: no limit)."""

    def __init__(self, limit: int, on_length: Optional[Callable[[int], None]] = None):
        self.limit = limit
        self._q: "queue.Queue[Item]" = queue.Queue()
        self.on_length = on_length
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._q.qsize()

    def empty(self) -> bool:
        return self._q.empty()

    def put_all(self, items: List[Item]) -> bool:
        """Queue them all, or none if they would pass the limit (False)."""
        with self._lock:
            if self.limit and self._q.qsize() + len(items) > self.limit:
                return False
            for it in items:
                self._q.put(it)
        self._length()
        return True

    def take(self, n: int, wait: float) -> List[Item]:
        """Up to n items: those queued now, or (none queued) the first to come within ``wait`` seconds."""
        out: List[Item] = []
        if n <= 0:
            return out
        try:
            out.append(self._q.get(timeout=wait) if wait > 0 else self._q.get_nowait())
        except queue.Empty:
            return out
        while len(out) < n:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                break
        self._length()
        return out

    def _length(self) -> None:
        if self.on_length is not None:
            self.on_length(self._q.qsize())
