"""Sentences through a running batch of B rows, outputs in order (:func:`stream`)."""
from typing import Iterable, Iterator, List, Tuple

# passes a run makes before it returns to refill, if no row finished
MAX_PASSES = 256


def stream(translator, sentences: Iterable[str], rows: int = 32, decoder=None, locked: bool = False,
           min_ms: float = 1.0) -> Iterator[str]:
    """The outputs of ``sentences`` (any iterable: read as rows free up), in
    order, each ``translator.translate(s)``'s.  Where the Translator's decoding
    runs in the engine's running batch (:class:`~.decoder.RunningDecoder`), the
    sentences stream through ``rows`` rows: a row that ends is refilled at the
    next pass boundary, so no sentence waits for a longer one; any other
    decoding goes in static batches of ``rows``.  A sentence the model cannot
    take raises ValueError naming it (its index from 0), after the outputs
    before it.  ``decoder``: the Translator's RunningDecoder (made here if not
    given); ``locked``: the caller holds the Translator's lock."""
    from .decoder import RunningDecoder

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    dec = decoder if decoder is not None else RunningDecoder.of(translator)
    if dec is None:
        yield from _static(translator, sentences, rows, locked)
        return
    prepared = (dec.prepare(text) for text in sentences)  # (read as rows free up; TooLong where one cannot)
    for tokens, _ in stream_prepared(dec.make_batch(), prepared, rows, min_ms):
        yield dec.finish(tokens)


def stream_prepared(batch, prepared: Iterable, rows: int, min_ms: float = 1.0) -> Iterator[Tuple[List[int], int]]:
    """Each prepared sentence's (:class:`~.decoder.Prepared`; ``prepared`` may raise
    :class:`~.decoder.TooLong` for one) output tokens and passes, in order, streamed
    through ``rows`` rows of the running batch ``batch``: a row that ends is refilled at
    the next pass boundary.  A sentence that cannot be prepared raises ValueError naming
    it (its index from 0), after the outputs before it."""
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
