"""Continuous batching on the native engine: a running batch whose sentences
join (after their encoder pass) and leave (at EOS or their length limit)
between passes (``csrc/loop/running_batch.h``).  Each sentence's tokens and scores
are those it gets decoded alone, whatever else is in the batch and whenever it
joined."""
import ctypes
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import c_api


def _i32(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)


def drafter_kind(drafter=None) -> str:
    """The engine's drafter where none is named: a feature drafter's where its
    engine is given, else source copies (greedy search's where drafts are
    capped at 0: :func:`run_settings`)."""
    return "feature" if drafter is not None else "copy"


def run_settings(kind: str, first: int, max_draft: Optional[int], budget: bool = False, min_len: int = 1,
                 unk_penalty: float = 0.0, temperature: float = 1.0, beta: int = 1, tau: float = 0.0,
                 forced: Optional[int] = None, scores: bool = True, **drafter) -> "c_api.RunSettings":
    """The engine's :class:`~fairseq_aggressive.native.c_api.RunSettings`: the
    drafter ``kind`` (one of ``c_api.DRAFTERS``) with its settings ``drafter``
    (fields of :class:`~fairseq_aggressive.native.c_api.DrafterSettings`, the
    others at their defaults), and the rules every pass shares (``forced``:
    the token every output starts with, or None); ``scores``: output tokens'
    scores kept (else NaN, and the passes skip summing log-normalisers over the
    vocabulary).  Source copies capped at 0 tokens are greedy search."""
    if kind not in c_api.DRAFTERS:
        raise ValueError(f"no engine drafter named {kind!r} (there are {', '.join(c_api.DRAFTERS)})")
    unknown = sorted(set(drafter) - set(c_api.DrafterSettings.DEFAULTS))
    if unknown:
        raise ValueError(f"no drafter setting named {', '.join(unknown)} "
                         f"(there are {', '.join(c_api.DrafterSettings.DEFAULTS)})")
    if max_draft is not None and max_draft < -1:
        raise ValueError(f"a draft cap of {max_draft}: 0 or more, or None (or -1) for none")
    d = dict(c_api.DrafterSettings.DEFAULTS, **drafter)
    if not 1 <= d["ngram_min"] <= d["ngram_max"]:
        raise ValueError(f"re-anchoring suffix lengths {d['ngram_min']}..{d['ngram_max']}: "
                         f"1 <= ngram_min <= ngram_max")
    if d["k"] < 1 or d["room"] < 1 or min_len < 0:
        raise ValueError(f"k {d['k']} and room {d['room']} must be positive, min_len {min_len} not negative")
    if kind == "copy" and max_draft == 0:
        kind = "greedy"
    d["shared_encoder"], d["causal"] = int(bool(d["shared_encoder"])), int(bool(d["causal"]))
    if forced is not None and forced < 0:
        raise ValueError(f"a forced first token of id {forced}")
    return c_api.RunSettings(drafter=kind.encode(), first=first, budget=int(bool(budget)), min_len=min_len,
                             unk_penalty=unk_penalty, temperature=temperature, beta=beta, tau=tau,
                             has_forced=int(forced is not None), forced=forced or 0,
                             draft=c_api.DrafterSettings(max_draft=c_api.draft_cap(max_draft), **d),
                             no_scores=int(not scores))


class RunningBatch:
    """A running batch on ``engine`` (a :class:`~fairseq_aggressive.native.NativeEngine`).

    ``first``: the token every sentence starts from (EOS, or a BOS);
    ``max_draft``: the longest draft a pass verifies (0: greedy search; None:
    no cap); ``ngram_min`` .. ``ngram_max``: the suffixes that re-anchor a copy
    after a rejection; ``budget``: each pass's lengths chosen by the engine's
    draft-length policy (else every draft as made); the score rules and
    acceptance (``min_len`` ... ``forced``) as :meth:`NativeBatch.step`'s;
    ``scores``: :meth:`take` gives each output token's score (else NaN, and
    each pass is spared the log-normalisers over the vocabulary scores need).

    With ``drafter`` (the engine of a drafter with a decoder of its own: a
    ``--feature-ar`` drafter, or GAD's block drafter with ``kind="nar"``) the
    drafts are that drafter's instead of source copies: up to ``k`` tokens per
    pass (and at most ``max_draft``) while ``bos``, the output and the draft fit
    its ``room`` positions; a feature drafter's end after their first token
    below ``min_prob`` (0: off); ``shared_encoder``: its sentences start from
    the verifier's encoder output (else its own encoder's); ``causal``: a
    block drafter with a causal prefix; with ``budget`` the policy also chooses
    how many tokens a feature drafter drafts.  ``settings``: these and the
    others of :class:`~fairseq_aggressive.native.c_api.DrafterSettings`.

    ``kind`` names the engine's drafter (``c_api.DRAFTERS``); by default a
    feature drafter's where ``drafter`` is given, greedy search's where
    ``max_draft`` is 0, else source copies.

    One thread drives it (:meth:`join`, :meth:`run`, :meth:`take`, :meth:`drop`);
    :meth:`wake` may be called from any thread."""

    def __init__(self, engine, first: int, max_draft: Optional[int], budget: bool = True, min_len: int = 1,
                 unk_penalty: float = 0.0, temperature: float = 1.0, beta: int = 1, tau: float = 0.0,
                 forced: Optional[int] = None, drafter=None, kind: Optional[str] = None, scores: bool = True,
                 **settings):
        self.engine, self.lib = engine, engine.lib
        self.drafter = drafter  # kept alive as long as the batch
        s = run_settings(kind or drafter_kind(drafter), first, max_draft, budget=budget, min_len=min_len,
                         unk_penalty=unk_penalty, temperature=temperature, beta=beta, tau=tau, forced=forced,
                         scores=scores, **settings)
        handle = self.lib.fa_run_new(engine.handle, drafter.handle if drafter is not None else None, ctypes.byref(s))
        if not handle:
            raise engine.failure("making a running batch")
        self.handle = handle
        self.kind = s.drafter.decode()  # the engine's drafter
        self.first, self.max_draft, self.budget = first, max_draft, bool(budget)
        self._cap = 0
        self._finished = np.empty(0, dtype=np.int32)

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.fa_run_free(handle)
            self.handle = None

    @property
    def active(self) -> int:
        """Sentences decoding now."""
        return self.lib.fa_run_active(self.handle)

    def join(self, sources: Sequence[Sequence[int]], copies: Sequence[Sequence[int]],
             max_lens: Sequence[int]) -> List[int]:
        """Sentences join, encoded together: each one's source tokens (source
        ids, no padding), its copy source (target ids) and its length limit
        (output tokens before EOS is forced).  Returns their slots."""
        n = len(sources)
        if not (n == len(copies) == len(max_lens)) or n == 0:
            raise ValueError(f"{n} sources, {len(copies)} copy sources, {len(max_lens)} length limits")
        src_len, copy_len = _i32([len(s) for s in sources]), _i32([len(c) for c in copies])
        flat = _i32([t for s in sources for t in s])
        cflat = _i32([t for c in copies for t in c]) if copy_len.sum() else np.zeros(1, dtype=np.int32)
        lims, slots = _i32(max_lens), np.empty(n, dtype=np.int32)
        rc = self.lib.fa_run_join(self.engine.handle, self.handle, n, flat.ctypes.data, src_len.ctypes.data,
                                  cflat.ctypes.data, copy_len.ctypes.data, lims.ctypes.data, slots.ctypes.data)
        if rc == -2:
            raise self.engine.failure("sentences joining a running batch")
        if rc != 0:
            raise ValueError("native engine: a sentence cannot join (an empty source, a length limit below "
                             "1 or below min_len, a forced first token outside the vocabulary, or a drafter "
                             "that does not read this verifier's features)")
        return slots.tolist()

    def run(self, max_passes: int = 1 << 30, min_ms: float = 0.0) -> List[int]:
        """Passes until a sentence finishes, ``max_passes`` passes or a
        :meth:`wake`, but while sentences remain not before ``min_ms``
        milliseconds; the slots of the sentences that finished."""
        n = self.active
        if n > self._cap:
            self._cap = max(n, 2 * self._cap)
            self._finished = np.empty(self._cap, dtype=np.int32)
        k = self.lib.fa_run_step(self.engine.handle, self.handle, int(max_passes), float(min_ms),
                                 self._finished.ctypes.data,
                                 max(self._cap, 1))
        if k < 0:
            raise self.engine.failure("a running batch's pass")
        return self._finished[:k].tolist()

    def take(self, slot: int, max_tokens: int) -> Tuple[List[int], List[float], int]:
        """A finished sentence's tokens, their scores (NaN without ``scores``) and its passes;
        its slot is free again."""
        toks = np.empty(max_tokens + 1, dtype=np.int32)
        scores = np.empty(max_tokens + 1, dtype=np.float32)
        passes = ctypes.c_int32()
        k = self.lib.fa_run_take(self.handle, slot, toks.ctypes.data, scores.ctypes.data, max_tokens + 1,
                                 ctypes.byref(passes))
        if k < 0:
            raise ValueError(f"slot {slot} has not finished")
        return toks[:k].tolist(), scores[:k].tolist(), passes.value

    def drop(self, slot: int) -> None:
        """An active sentence leaves unfinished (its client went away); its slot is free again."""
        if self.lib.fa_run_drop(self.handle, slot) != 0:
            raise ValueError(f"slot {slot} is not decoding")

    def wake(self) -> None:
        """Make a :meth:`run` under way return at its next pass boundary (any thread)."""
        self.lib.fa_run_wake(self.handle)

    def stats(self) -> "c_api.RunStats":
        """The counters since the batch was made."""
        out = c_api.RunStats()
        self.lib.fa_run_stats(self.handle, ctypes.byref(out))
        return out
