"""The lanes of a stream (fairseq_aggressive/streaming/stream.py, stream_lanes):
several running batches, each driven by a thread of its own, taking sentences
from one shared source.  Checked on stand-in batches whose passes take random
time (so the lanes interleave differently in every run): every sentence is
decoded exactly once and given back in input order, at more lanes than cores;
a sentence that cannot be prepared is named after the outputs before it; a
lane's failure is raised once every lane has stopped; closing the stream
early stops the lanes; a slow consumer holds the sentences read and not yet
given back to about ``ahead``, and a small ``ahead`` never stalls the
stream.  The shared source is read under a lock: with a source
that waits between handing out an index and advancing it, the same run without
the lock must go wrong (the check can fail)."""
import random
import threading
import time
from types import SimpleNamespace

import pytest

from fairseq_aggressive.streaming.decoder import TooLong
from fairseq_aggressive.streaming.stream import stream_lanes


class Batch:
    """RunningBatch's join / run / take / wake: a row 'decodes' its source doubled,
    after (its first token mod 5) + 1 passes; each pass sleeps up to ``pause`` s."""

    def __init__(self, seed, pause=0.0005, fail_after=None):
        self.rng, self.pause, self.fail_after = random.Random(seed), pause, fail_after
        self.rows, self.finished, self.next_slot, self.runs = {}, {}, 0, 0
        self.most = 0  # the most rows it held at once

    def join(self, sources, copies, max_lens):
        slots = []
        for src in sources:
            self.rows[self.next_slot] = [src, src[0] % 5 + 1]
            slots.append(self.next_slot)
            self.next_slot += 1
        self.most = max(self.most, len(self.rows))
        return slots

    def run(self, max_passes, min_ms=0.0):
        self.runs += 1
        if self.fail_after is not None and self.runs > self.fail_after:
            raise RuntimeError("native engine: a verification pass failed (injected)")
        time.sleep(self.rng.random() * self.pause)
        done = []
        for slot, row in list(self.rows.items()):
            row[1] -= 1
            if row[1] == 0:
                self.finished[slot] = self.rows.pop(slot)[0]
                done.append(slot)
        return done

    def take(self, slot, max_tokens):
        src = self.finished.pop(slot)
        return [2 * t for t in src], [0.0] * len(src), 1

    def wake(self):
        pass


def prepared(n, too_long=None, hold=0.0):
    """Sentence i has source [i, i + 1]; sentence ``too_long`` cannot be prepared;
    ``hold``: each read waits this long before it returns (a wide window)."""
    for i in range(n):
        if hold:
            time.sleep(hold)
        if i == too_long:
            raise TooLong(f"is {1000 + i} tokens long after BPE; the model takes at most 200")
        yield SimpleNamespace(source=[i, i + 1], copy=[], max_len=10)


def want(n):
    return [[2 * i, 2 * i + 2] for i in range(n)]


@pytest.mark.parametrize("lanes,rows", [(2, 32), (3, 7), (8, 16), (5, 5)])
def test_every_sentence_once_in_order(lanes, rows):
    for seed in range(6):
        batches = [Batch(seed * 31 + k) for k in range(lanes)]
        got = [tokens for tokens, _ in stream_lanes(batches, prepared(200), rows)]
        assert got == want(200), (lanes, rows, seed)
        assert all(not b.rows and not b.finished for b in batches)  # every row taken


def test_one_lane_is_the_plain_stream():
    got = [tokens for tokens, _ in stream_lanes([Batch(0)], prepared(50), 4)]
    assert got == want(50)


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_a_lane_holds_at_most_lane_rows(lanes):
    """Rows beyond ``lane_rows`` a lane are not decoded at once: the sentences wait to join
    (each lane fills up to its bound), and every output still comes once, in order."""
    batches = [Batch(k) for k in range(lanes)]
    got = [tokens for tokens, _ in stream_lanes(batches, prepared(300), 64, lane_rows=5)]
    assert got == want(300)
    assert [b.most for b in batches] == [5] * lanes
    wide = [Batch(k) for k in range(lanes)]  # (no bound: each lane holds its share of the rows)
    assert [tokens for tokens, _ in stream_lanes(wide, prepared(300), 64)] == want(300)
    assert all(b.most > 5 for b in wide)


def test_a_sentence_that_cannot_be_prepared_is_named_after_those_before_it():
    for seed in range(4):
        got = []
        with pytest.raises(ValueError, match=r"^sentence 37 is 1037 tokens long"):
            for tokens, _ in stream_lanes([Batch(seed), Batch(seed + 100)], prepared(80, too_long=37), 16):
                got.append(tokens)
        assert got == want(37)


def test_a_lanes_failure_is_raised_after_every_lane_stopped():
    batches = [Batch(1), Batch(2, fail_after=5), Batch(3)]
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="injected"):
        list(stream_lanes(batches, prepared(300), 12))
    assert threading.active_count() == before  # no lane left running


def test_closing_the_stream_early_stops_the_lanes():
    before = threading.active_count()
    it = stream_lanes([Batch(k) for k in range(3)], prepared(10000), 12)
    first = [next(it)[0] for _ in range(20)]
    t0 = time.perf_counter()
    it.close()
    assert time.perf_counter() - t0 < 5.0
    assert first == want(20)
    assert threading.active_count() == before


class NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_shared_source_needs_its_lock():
    """Reading the source takes its index and advances it: with 4 lanes and a source that
    waits inside each read, the lock keeps every index once; without it, two lanes read
    at once (the generator refuses: 'already executing') or an index is given twice."""
    batches = [Batch(k, pause=0.0) for k in range(4)]
    got = [tokens for tokens, _ in stream_lanes(batches, prepared(60, hold=0.002), 8)]
    assert got == want(60)
    with pytest.raises(Exception):
        got = [tokens for tokens, _ in stream_lanes([Batch(k, pause=0.0) for k in range(4)],
                                                     prepared(60, hold=0.002), 8, lock=NoLock())]
        assert got == want(60)


def test_reading_stays_within_ahead_of_a_slow_consumer():
    """A consumer slower than the lanes: at most ``ahead`` sentences read and not given back,
    and one more per lane (read while another checked the bound); with the bound beyond the
    input the lanes read far ahead (so the check can fail)."""
    def worst_ahead(ahead):
        reads, given, worst = [0], [0], [0]

        def source():
            for x in prepared(120):
                reads[0] += 1
                worst[0] = max(worst[0], reads[0] - given[0])
                yield x

        got = []
        for tokens, _ in stream_lanes([Batch(k, pause=0.0) for k in range(3)], source(), 12, ahead=ahead):
            got.append(tokens)
            given[0] += 1
            time.sleep(0.002)
        assert got == want(120)
        return worst[0]

    assert worst_ahead(8) <= 8 + 3
    assert worst_ahead(10 ** 6) > 8 + 3


@pytest.mark.parametrize("ahead", [1, 2, 5])
def test_a_small_ahead_never_stalls(ahead):
    for seed in range(4):
        got = [tokens for tokens, _ in stream_lanes([Batch(seed * 7 + k) for k in range(4)], prepared(100), 16,
                                                    ahead=ahead)]
        assert got == want(100), (ahead, seed)
