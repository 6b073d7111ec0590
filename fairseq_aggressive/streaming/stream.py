"""Sentences through a running batch of B rows, outputs in order (:func:`stream`)."""
import queue
import threading
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

# passes a run makes before it returns to refill, if no row finished
MAX_PASSES = 256
# what a source of stream_prepared gives for "nothing to join now" (not its end)
LATER = object()


def stream(translator, sentences: Iterable[str], rows: int = 32, decoder=None, locked: bool = False,
           min_ms: float = 1.0, lanes: Optional[int] = None) -> Iterator[str]:
    """The outputs of ``sentences`` (any iterable: read as rows free up), in
    order, each ``translator.translate(s)``'s.  Where the Translator's decoding
    runs in the engine's running batch (:class:`~.decoder.RunningDecoder`), the
    sentences stream through ``rows`` rows: a row that ends is refilled at the
    next pass boundary, so no sentence waits for a longer one; the rows are
    split among ``lanes`` running batches, one thread each (default: one per
    engine thread, :meth:`~.decoder.RunningDecoder.lanes`).  Any other decoding
    goes in static batches of ``rows``.  A sentence the model cannot take
    raises ValueError naming it (its index from 0), after the outputs before
    it.  ``decoder``: the Translator's RunningDecoder (made here if not given);
    ``locked``: the caller holds the Translator's lock."""
    from .decoder import RunningDecoder

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if lanes is not None and lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    dec = decoder if decoder is not None else RunningDecoder.of(translator)
    if dec is None:
        yield from _static(translator, sentences, rows, locked)
        return
    text = threading.Lock()  # a lane's prepare and this thread's finish take turns with the text tools
    prepared = (dec.prepare(s) for s in sentences)  # (read as rows free up; TooLong where one cannot)
    batches = dec.make_batches(dec.lanes(rows, lanes))
    for tokens, _ in stream_lanes(batches, prepared, rows, min_ms, text, lane_rows=dec.lane_rows()):
        with text:
            out = dec.finish(tokens)
        yield out


def stream_lanes(batches: Sequence, prepared: Iterable, rows: int, min_ms: float = 1.0,
                 lock: Optional[threading.Lock] = None, ahead: Optional[int] = None,
                 lane_rows: Optional[int] = None) -> Iterator[Tuple[List[int], int]]:
    """:func:`stream_prepared` with the ``rows`` split among the running batches
    ``batches`` (lanes: each on an engine of its own, one thread each, on one
    copy of the weights), each driven by a thread of its own that takes the
    next sentence of ``prepared`` (under ``lock``) whenever its rows free up.
    The lanes never wait for each other: a pass of one lane is never a barrier
    for the other, so the lanes keep every core busy where one batch's
    products, shared among threads, would meet at every call (and wait on a
    thread the machine is not running).  Outputs in input order; a sentence
    that cannot be prepared raises ValueError naming it after the outputs
    before it; a lane's failure is raised once every lane has stopped.  Closing
    the iterator lets the rows under way finish, and nothing more joins.

    At most about ``ahead`` sentences (default: 4 x rows, at least 64) are read
    and not yet given back: beyond that a lane that still holds sentences goes
    on decoding them, and one that holds none waits for the consumer.  No
    deadlock: a lane waits only while it holds no sentence, and the consumer
    waits only for the sentence at its position, which is read (else fewer than
    ``ahead`` would be out) and held by a lane that does not wait, or already
    given to the consumer's queue.

    ``lane_rows``: the most rows a lane decodes at once (its share of ``rows`` if fewer;
    ``NativeEngine.lane_rows``): beyond it the sentences wait to join, as beyond ``rows``."""
    if len(batches) == 1:
        yield from stream_prepared(batches[0], prepared, rows if lane_rows is None else min(rows, lane_rows), min_ms)
        return
    from .decoder import TooLong

    n = len(batches)
    lock = lock if lock is not None else threading.Lock()
    ahead = ahead if ahead is not None else max(4 * rows, 64)
    source = iter(prepared)
    shared = {"read": 0, "given": 0, "exhausted": False, "error": None}
    stop = threading.Event()
    room = threading.Condition()  # "given" moved (apart from the source's lock: a read may block)
    results: "queue.SimpleQueue" = queue.SimpleQueue()

    def pull(order: List[int], out: List[int]):
        # this lane's sentences: the shared source's next, its index into order (out[0]: of them given)
        while not stop.is_set():
            with room:
                while not stop.is_set() and shared["read"] - shared["given"] >= ahead and len(order) == out[0]:
                    room.wait(0.05)  # (holds none: waits for the consumer)
                full = shared["read"] - shared["given"] >= ahead
            if stop.is_set():
                return
            if full:  # (holds some: decodes them first)
                yield LATER
                continue
            with lock:
                if shared["exhausted"]:
                    return
                i = shared["read"]
                try:
                    x = next(source, None)
                except TooLong as e:  # no sentence after it is read: those before it are decoded first
                    shared["error"], shared["exhausted"] = ValueError(f"sentence {i} {e}"), True
                    return
                if x is None:
                    shared["exhausted"] = True
                    return
                shared["read"] = i + 1
            order.append(i)
            yield x

    def lane(k: int, share: int):
        order: List[int] = []
        given = [0]
        try:
            for j, out in enumerate(stream_prepared(batches[k], pull(order, given), share, min_ms)):
                given[0] = j + 1
                results.put((order[j], out))
        except BaseException as e:  # noqa: B902 (handed to the consumer's thread)
            results.put((-1, e))
        finally:
            results.put((-1, None))

    shares = [rows // n + (k < rows % n) for k in range(n)]
    if lane_rows is not None:
        shares = [min(share, lane_rows) for share in shares]
    threads = [threading.Thread(target=lane, args=(k, shares[k]), name=f"fairseq-aggressive-lane-{k}", daemon=True)
               for k in range(n)]
    for t in threads:
        t.start()
    done, written, live, failure = {}, 0, n, None
    try:
        while live:
            i, out = results.get()
            if i < 0:
                if out is None:
                    live -= 1
                elif failure is None:  # the other lanes finish their rows, and nothing more joins
                    failure = out
                    stop.set()
                continue
            done[i] = out
            while written in done:
                item = done.pop(written)
                written += 1
                with room:
                    shared["given"] = written
                    room.notify_all()
                yield item
        if failure is not None:
            raise failure
        if shared["error"] is not None:
            raise shared["error"]
    finally:
        stop.set()
        with room:
            room.notify_all()
        for b in batches:
            b.wake()
        for t in threads:
            t.join()


def stream_prepared(batch, prepared: Iterable, rows: int, min_ms: float = 1.0) -> Iterator[Tuple[List[int], int]]:
    """Each prepared sentence's (:class:`~.decoder.Prepared`; ``prepared`` may raise
    :class:`~.decoder.TooLong` for one) output tokens and passes, in order, streamed
    through ``rows`` rows of the running batch ``batch``: a row that ends is refilled at
    the next pass boundary.  A sentence that cannot be prepared raises ValueError naming
    it (its index from 0), after the outputs before it.  ``prepared`` may give
    :data:`LATER` for "none to join now": the rows decode on, and it is asked again."""
    from .decoder import TooLong

    source = iter(prepared)
    slots, limits, done = {}, {}, {}
    read = written = 0
    exhausted, error = False, None
    # rows are refilled once a quarter of them is free (or none decodes): the sentences that join
    # together share one encoder pass, which costs per sentence far less in a group than alone
    refill = max(1, rows // 4)
    while True:
        fresh = []
        while not exhausted and rows - len(slots) >= (refill if slots else 1) and len(slots) + len(fresh) < rows:
            try:
                x = next(source, None)
            except TooLong as e:  # the sentences before it are decoded and given first
                error, exhausted = ValueError(f"sentence {read} {e}"), True
                break
            if x is None:
                exhausted = True
                break
            if x is LATER:
                break
            fresh.append((read, x))
            read += 1
        if fresh:
            p = [x for _, x in fresh]
            joined = batch.join([x.source for x in p], [x.copy for x in p], [x.max_len for x in p])
            for (i, x), slot in zip(fresh, joined):
                slots[slot], limits[slot] = i, x.max_len
        if not slots:
            break
        for slot in batch.run(MAX_PASSES, min_ms if len(slots) > 1 else 0.0):
            tokens, _, passes = batch.take(slot, limits.pop(slot))
            done[slots.pop(slot)] = (tokens, passes)
        while written in done:
            yield done.pop(written)
            written += 1
    if error is not None:
        raise error


def _static(translator, sentences: Iterable[str], rows: int, locked: bool) -> Iterator[str]:
    chunk, first = [], 0
    for s in sentences:
        chunk.append(s)
        if len(chunk) == rows:
            yield from translator.translate_static(chunk, locked=locked, first_index=first)
            chunk, first = [], first + rows
    if chunk:
        yield from translator.translate_static(chunk, locked=locked, first_index=first)
