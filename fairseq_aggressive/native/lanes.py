"""A static batch decoded in lanes (:func:`decode_in_lanes`): its sentences
dealt among one-thread engines on the same weights, each part decoded by the
engine's loop on a thread of its own, all at once.  The parts never wait for
each other, where one batch whose products are shared among threads meets at
every call (and waits on a thread the machine is not running).  Every
sentence's tokens and scores are those the whole batch gives it: a row's
computation is its own in any batch (the linear kernels give a row the same
bits in any block of rows), and the length limit stays the batch's."""
import ctypes
import threading
from typing import List

import numpy as np

from . import c_api
from .batch import copy_sources


def add_counts(total: ctypes.Structure, other: ctypes.Structure) -> None:
    """Adds every counter of ``other`` to ``total`` (the same ctypes structure:
    nested structures and arrays field by field)."""
    for name, _ in type(total)._fields_:
        mine, theirs = getattr(total, name), getattr(other, name)
        if isinstance(mine, ctypes.Structure):
            add_counts(mine, theirs)
        elif isinstance(mine, ctypes.Array):
            for i in range(len(mine)):
                mine[i] += theirs[i]
        else:
            setattr(total, name, mine + theirs)


def decode_in_lanes(lanes: List, settings: "c_api.RunSettings", max_len: int, copy=None, copy_len=None,
                    batch=None, src_tokens=None, tree_room: int = 0):
    """One static batch decoded whole by the engine's loop (as ``NativeBatch.decode``,
    without a drafter engine), sentence b by engine ``lanes[b % k]`` (k: the lanes, at
    most the sentences), the parts at once on k threads (this one and k - 1 more).
    Either ``batch``, a :class:`~fairseq_aggressive.native.batch.NativeBatch` just begun
    (its sentences move to the lanes), or ``src_tokens``, the batch's source rows, which
    each lane encodes for itself (``NativeEngine.begin`` with ``tree_room``).  The same
    per-sentence tokens, scores and passes as the whole batch decoded alone, in its
    order; the counters summed over the parts.  A part's failure is raised once every
    part has finished."""
    n = len(batch.src_keep) if batch is not None else int(src_tokens.size(0))
    k = min(len(lanes), n)
    if k < 2:
        raise ValueError(f"{len(lanes)} lanes for {n} sentences: decode the batch whole")
    copy, copy_len = copy_sources(copy, copy_len, n)
    starts = np.concatenate([[0], np.cumsum(copy_len)])
    groups = [list(range(j, n, k)) for j in range(k)]
    # a begun batch gives its sentences up here, on one thread (each take reads the whole state)
    parts = [batch.take(g, lanes[j]) for j, g in enumerate(groups)] if batch is not None else None
    results, errors = [None] * k, [None] * k

    def work(j: int) -> None:
        g = groups[j]
        own = np.concatenate([copy[starts[b]:starts[b + 1]] for b in g])
        try:
            part = parts[j] if parts is not None else lanes[j].begin(src_tokens[g], max_len, tree_room=tree_room)
            results[j] = part.decode(settings, max_len, own, copy_len[g])
        except BaseException as e:  # noqa: B902 (raised on the caller's thread)
            errors[j] = e

    threads = [threading.Thread(target=work, args=(j,), name=f"fairseq-aggressive-lane-{j}") for j in range(1, k)]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    tokens, scores, passes = [None] * n, [None] * n, [0] * n
    stats = c_api.RunStats()
    for g, (toks, sc, ps, st) in zip(groups, results):
        for i, b in enumerate(g):
            tokens[b], scores[b], passes[b] = toks[i], sc[i], ps[i]
        add_counts(stats, st)
    return tokens, scores, passes, stats
