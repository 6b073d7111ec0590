"""One encoded batch in the native engine: its sentences' decoder caches,
verification passes (:meth:`NativeBatch.step`), the whole batch decoded by
the engine's loop with one of its drafters (:meth:`NativeBatch.decode`) and
beam search (:meth:`NativeBatch.decode_beam`)."""
import ctypes
from typing import List, Optional, Sequence

import numpy as np
import torch

from . import c_api


def _addr(buf) -> Optional[int]:
    """The address of a ctypes array or numpy array (None for None)."""
    if buf is None:
        return None
    return buf.ctypes.data if isinstance(buf, np.ndarray) else ctypes.addressof(buf)


class _LoopBuffers:
    """Where the engine's loop writes the tokens, scores and passes of n
    sentences of up to ``max_len + 1`` tokens (:meth:`output`, a StaticOutput),
    and what it wrote (:meth:`results`)."""

    def __init__(self, n: int, max_len: int):
        self.cap = max_len + 1
        self.tokens = np.empty((n, self.cap), dtype=np.int32)
        self.scores = np.empty((n, self.cap), dtype=np.float32)
        self.out_len, self.passes = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)

    def output(self) -> "c_api.StaticOutput":
        return c_api.StaticOutput(out_cap=self.cap, out_tokens=_addr(self.tokens), out_scores=_addr(self.scores),
                                out_len=_addr(self.out_len), passes=_addr(self.passes))

    def results(self):
        """Per sentence its tokens and scores, and the passes each took part in (lists)."""
        lens = self.out_len.tolist()
        return ([self.tokens[b, :k].tolist() for b, k in enumerate(lens)],
                [self.scores[b, :k].tolist() for b, k in enumerate(lens)], self.passes.tolist())


def copy_sources(copy, copy_len, n: int):
    """``n`` sentences' copy sources (target ids, ``copy_len[b]`` each, concatenated; None:
    none) as int32 arrays, the tokens never empty; ValueError if the lengths do not fit."""
    if copy is None:
        copy, copy_len = np.zeros(1, dtype=np.int32), np.zeros(n, dtype=np.int32)
    copy = np.ascontiguousarray(copy, dtype=np.int32)
    copy_len = np.ascontiguousarray(copy_len, dtype=np.int32)
    if len(copy_len) != n or int(copy_len.sum()) > len(copy):
        raise ValueError(f"copy sources: {len(copy_len)} lengths adding up to {int(copy_len.sum())} for "
                         f"{n} sentences and {len(copy)} tokens")
    if len(copy) == 0:
        copy = np.zeros(1, dtype=np.int32)
    return copy, copy_len


class StateHandle:
    """A decoder state of the engine (``fa_begin``, ``fa_begin_encoded``),
    freed when the last reference to it goes."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, handle

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.fa_state_free(handle)
            self.handle = None


# NativeBatch.step's scores: PassArgs::scores (csrc/model/pass.h)
_SCORES = {"all": 0, "last": 1}


class NativeBatch:
    """The encoded sentences of one batch and their decoder caches
    (:meth:`~fairseq_aggressive.native.NativeEngine.begin` makes it)."""

    def __init__(self, engine, n: int, flat: np.ndarray, lengths: np.ndarray, cap: int):
        self.engine, self.lib = engine, engine.lib
        flat = np.ascontiguousarray(flat, dtype=np.int32)
        lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        handle = self.lib.fa_begin(engine.handle, n, flat.ctypes.data, lengths.ctypes.data, cap)
        if not handle:
            raise engine.failure("encoding a batch")
        self._state = StateHandle(self.lib, handle)
        self._rows_cap = self._tok_cap = 0
        self._args = c_api.PassArgs()
        self.features = None  # after step(features=True): the emitted tokens' decoder features

    @property
    def handle(self):
        """The engine's state of this batch."""
        return self._state.handle

    def encoder_out(self):
        """The verifier's encoder output as fairseq's encoder returns it
        (``encoder_out`` S x B x C, zeros at padding; ``encoder_padding_mask``
        B x S), for a drafter that shares the verifier's encoder."""
        keep = self.src_keep
        C = self.engine.embed_dim
        flat = torch.empty(int(keep.sum()), C, dtype=torch.float32)
        n = self.lib.fa_encoder_out(self.handle, flat.data_ptr(), flat.numel())
        if n != flat.numel():
            raise RuntimeError(f"native engine: {n} encoder values, expected {flat.numel()}")
        enc = torch.zeros(*keep.shape, C, dtype=torch.float32)
        enc[keep] = flat
        return {"encoder_out": [enc.transpose(0, 1)], "encoder_padding_mask": [~keep],
                "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}

    def _buffers(self, n_rows: int, n_tokens: int):
        if n_rows > self._rows_cap or n_tokens > self._tok_cap:
            self._rows_cap, self._tok_cap = max(n_rows, self._rows_cap), max(n_tokens, 2 * self._tok_cap)
            I, F = ctypes.c_int32, ctypes.c_float
            self._sent, self._lens, self._n_emit, self._n_match, self._done, self._nb, self._win = (
                (I * self._rows_cap)() for _ in range(7))
            self._tok, self._choice, self._blen = (I * self._tok_cap)(), (I * self._tok_cap)(), (I * self._tok_cap)()
            self._score = (F * self._tok_cap)()
            self._feats = None

    def step(self, sents: Sequence[int], rows: Sequence[List[int]], max_len: int, min_len: int,
             unk_penalty: float, temperature: float, branches: Optional[Sequence[List[int]]] = None,
             features: bool = False, beta: int = 1, tau: float = 0.0, forced: Optional[int] = None,
             scores: str = "all"):
        """One pass; ``rows[i]`` = [last token] + draft of sentence ``sents[i]``.
        With ``branches``, ``branches[i]`` lists the lengths of the drafts that
        follow the last token in ``rows[i]`` one after the other (each is a
        continuation of the last token; the pass keeps the one that accepts
        most).  Returns per row the emitted tokens, their scores, the accepted
        draft length, whether EOS was emitted and the index of the kept draft.
        With ``features``, :attr:`features` then holds the decoder features
        (last layer, normalised) each emitted token was chosen from, the rows'
        emitted tokens one after the other (sum of n_emit x C).  ``beta`` > 1
        accepts GAD++'s way (:class:`~fairseq_aggressive.acceptance.RankAcceptance`:
        a drafted token among the top ``beta`` within ``tau`` of the top one's
        log-probability) instead of greedy's.  ``forced``: the token every
        output starts with (at output position 0 nothing else is chosen or
        accepted; its score is its log-probability), or None.  ``scores``:
        ``"all"`` emitted tokens' or ``"last"``, each row's last one's (the
        others NaN), as the engine's loop asks for a row's confidence: its
        log-normaliser a coarse sum (``logsumexp_coarse``, at most 0.06 above
        the exact one), over the screened projection's logits where the model
        has a screen."""
        if scores not in _SCORES:
            raise ValueError(f"scores must be one of {sorted(_SCORES)}, not {scores!r}")
        n = len(rows)
        lens = [len(r) for r in rows]
        flat = rows[0] if n == 1 else [t for r in rows for t in r]
        self._buffers(n, len(flat))
        self._sent[:n], self._lens[:n], self._tok[: len(flat)] = sents, lens, flat
        nb = blen = None
        if branches is not None:
            if len(branches) != n:
                raise ValueError(f"{len(branches)} branch lists for {n} rows")
            bflat = [x for b in branches for x in b]
            for r, b in zip(rows, branches):
                if not b or 1 + sum(b) != len(r) or (len(b) > 1 and min(b) < 1):
                    raise ValueError(f"branch lengths {b} do not split a row of {len(r)} tokens")
            self._nb[:n], self._blen[: len(bflat)] = [len(b) for b in branches], bflat
            nb, blen = self._nb, self._blen
        fptr = None
        if features:
            if self._feats is None:
                self._feats = torch.empty(self._tok_cap, self.engine.embed_dim, dtype=torch.float32)
            fptr = self._feats.data_ptr()
        a = self._args
        a.n, a.max_len, a.min_len = n, max_len, min_len
        a.unk_penalty, a.temperature, a.beta, a.tau = unk_penalty, temperature, beta, tau
        a.has_forced, a.forced = int(forced is not None), forced or 0
        a.scores = _SCORES[scores]
        a.sent, a.row_len, a.tokens = _addr(self._sent), _addr(self._lens), _addr(self._tok)
        a.n_branch, a.branch_len = _addr(nb), _addr(blen)
        a.choice, a.score, a.feats = _addr(self._choice), _addr(self._score), fptr
        a.n_emit, a.n_match, a.done, a.winner = (_addr(b) for b in (self._n_emit, self._n_match, self._done, self._win))
        rc = self.lib.fa_pass(self.engine.handle, self.handle, ctypes.byref(a))
        if rc == -2:
            raise self.engine.failure("a verification pass")
        if rc != 0:
            raise RuntimeError("native engine: a row does not fit its sentence's cache (or the forced first "
                               "token is outside the vocabulary or comes with a shortlist)")
        n_emit = self._n_emit[:n]
        toks, scores, o = [], [], 0
        for k, ne in zip(lens, n_emit):
            toks.append(self._choice[o : o + ne])
            scores.append(self._score[o : o + ne])
            o += k
        if features:
            if n == 1:
                self.features = self._feats[: n_emit[0]].clone()
            else:
                ne = np.asarray(n_emit)  # emitted token j of row r sits at row offset + j
                idx = np.arange(ne.sum()) + np.repeat(np.cumsum(lens) - lens - (np.cumsum(ne) - ne), ne)
                self.features = self._feats[torch.from_numpy(idx)]
        return toks, scores, self._n_match[:n], self._done[:n], self._win[:n]

    def decode(self, settings: "c_api.RunSettings", max_len: int, copy: Optional[np.ndarray] = None,
               copy_len: Optional[np.ndarray] = None, drafter=None, drafter_state=None):
        """Decodes the whole batch (just begun) by the engine's loop: a running
        batch whose sentences all join at once, each with the length limit
        ``max_len`` (the batch's, as fairseq's), drafted by the engine's drafter
        ``settings.drafter`` (``settings``: :func:`~fairseq_aggressive.native.running.run_settings`).
        ``copy``: each sentence's copy source (target ids, padding removed;
        ``copy_len[b]`` tokens each, concatenated; none: empty); ``drafter``,
        ``drafter_state``: a feature drafter's
        :class:`~fairseq_aggressive.native.NativeEngine` and its state of these
        sentences (begun from this batch's encoder output).  Returns per
        sentence its tokens, their scores and the passes it took part in, and
        the loop's counters (a :class:`~fairseq_aggressive.native.c_api.RunStats`).
        The batch's caches are used up: a batch decodes once."""
        n = len(self.src_keep)
        copy, copy_len = copy_sources(copy, copy_len, n)
        buf = _LoopBuffers(n, max_len)
        out, stats = buf.output(), c_api.RunStats()
        rc = self.lib.fa_decode(self.engine.handle, self.handle, drafter.handle if drafter is not None else None,
                                drafter_state.handle if drafter_state is not None else None, ctypes.byref(settings),
                                _addr(copy), _addr(copy_len), max_len, ctypes.byref(out), ctypes.byref(stats))
        if rc == -2:
            raise self.engine.failure("the decoding loop")
        if rc != 0:
            raise ValueError(f"native engine: the {settings.drafter.decode()} loop does not fit the batch ({n} "
                             f"sentences, length limit {max_len}; a batch decodes once, a feature drafter must read "
                             "this verifier's features, blockwise drafts need proposal heads)")
        return buf.results() + (stats,)

    def take(self, which: Sequence[int], engine) -> "NativeBatch":
        """The sentences ``which`` of this batch (just begun, none decoded) moved into a
        batch of their own that ``engine`` decodes (another engine on the same weights:
        a lane); this batch keeps the others, and decodes no more."""
        idx = np.ascontiguousarray(which, dtype=np.int32)
        handle = self.lib.fa_state_take(self.handle, len(idx), idx.ctypes.data)
        if not handle:
            raise ValueError(f"native engine: sentences {idx.tolist()} cannot leave a batch of {len(self.src_keep)} "
                             "(each once, before any pass; not a beam's hypotheses)")
        part = object.__new__(NativeBatch)
        part.engine, part.lib = engine, engine.lib
        part._state = StateHandle(self.lib, handle)
        part._rows_cap = part._tok_cap = 0
        part._args = c_api.PassArgs()
        part.features = None
        part.src_keep = self.src_keep[torch.as_tensor(idx, dtype=torch.long)]
        return part

    def decode_beam(self, beam: int, nbest: int, first: int, max_len: int, min_len: int, unk_penalty: float,
                    temperature: float, len_penalty: float = 1.0, normalize: bool = True, no_repeat_ngram: int = 0,
                    src: Optional[np.ndarray] = None, src_len: Optional[np.ndarray] = None, max_draft: int = 0,
                    ngram_min: int = 1, ngram_max: int = 4, draft_hyps: int = 1):
        """Beam search over the whole batch (just begun) in the engine: fairseq's
        SequenceGenerator with BeamSearch (``csrc/beam/beam_search.h``), ``beam``
        hypotheses per sentence from the token ``first``, ``max_len`` and
        ``min_len`` as fairseq applies them (``max_len`` the batch's), scores
        divided by (length + 1) ** ``len_penalty`` where ``normalize``;
        ``no_repeat_ngram``: n-grams of that many tokens never repeat in a
        hypothesis (0: off).  With ``src`` (each sentence's copy source in target
        ids, ``src_len[b]`` tokens each, concatenated), the first ``draft_hyps``
        hypotheses of each beam are drafted from their sources (at most
        ``max_draft`` tokens; re-anchoring on suffixes of ``ngram_min`` ..
        ``ngram_max`` tokens): the same output, in fewer passes.  Returns per sentence its ``nbest`` best ended hypotheses, best
        first (dicts of ``tokens``: EOS last, an int32 array; ``score``: a float;
        ``positional_scores``: a float32 array), and the search's
        :class:`~fairseq_aggressive.native.c_api.BeamCounts`."""
        n = len(self.src_keep)
        W = max_len + 1
        n_out = np.empty(n * nbest, dtype=np.int32)
        tokens = np.empty((n * nbest, W), dtype=np.int32)
        positional = np.empty((n * nbest, W), dtype=np.float32)
        score = np.empty(n * nbest, dtype=np.float32)
        a = c_api.BeamArgs(beam=beam, nbest=nbest, first=first, max_len=max_len, min_len=min_len,
                           unk_penalty=unk_penalty, temperature=temperature, len_penalty=len_penalty,
                           normalize=int(bool(normalize)), no_repeat_ngram=no_repeat_ngram, n_out=_addr(n_out),
                           tokens=_addr(tokens), positional=_addr(positional), score=_addr(score),
                           max_draft=max_draft, ngram_min=ngram_min, ngram_max=ngram_max, draft_hyps=draft_hyps)
        if src is not None:
            src = np.ascontiguousarray(src, dtype=np.int32)
            src_len = np.ascontiguousarray(src_len, dtype=np.int32)
            if len(src_len) != n or int(src_len.sum()) != len(src):
                raise ValueError(f"copy sources: {len(src_len)} lengths adding up to {int(src_len.sum())} for "
                                 f"{n} sentences and {len(src)} tokens")
            a.src, a.src_len = _addr(src), _addr(src_len)
        counts = c_api.BeamCounts()
        rc = self.lib.fa_decode_beam(self.engine.handle, self.handle, ctypes.byref(a), ctypes.byref(counts))
        if rc == -2:
            raise self.engine.failure("beam search")
        if rc != 0:
            raise ValueError(f"native engine: beam search of beam {beam}, nbest {nbest}, lengths {min_len}..{max_len}, "
                             f"first token {first} does not fit this batch (nbest <= beam, 2 x beam <= the "
                             "vocabulary, max_len + 1 within the target positions, max_draft >= 0, draft_hyps "
                             ">= 0 and 1 <= ngram_min <= ngram_max with sources, a batch without a shortlist that no "
                             "other search decoded)")
        out = []
        for b in range(n):
            hyps = []
            for i in range(nbest):
                row = b * nbest + i
                k = int(n_out[row])
                if k < 0:
                    break
                hyps.append({"tokens": tokens[row, :k], "score": float(score[row]), "positional_scores": positional[row, :k]})
            out.append(hyps)
        return out, counts

    def heads(self, sents: Sequence[int], feats: torch.Tensor) -> List[List[int]]:
        """The model's proposal heads on feature rows ``feats`` (one float32 row
        of the model's width per sentence ``sents[i]``): each head's token per sentence."""
        n, H = len(sents), self.engine.n_heads
        feats = feats.to(torch.float32).contiguous()
        if tuple(feats.shape) != (n, self.engine.embed_dim):
            raise ValueError(f"native heads: features {tuple(feats.shape)} for {n} sentences")
        sent = np.array(sents, dtype=np.int32)
        out = np.empty(n * max(H, 1), dtype=np.int32)
        rc = self.lib.fa_heads(self.engine.handle, self.handle, n, sent.ctypes.data, feats.data_ptr(), out.ctypes.data)
        if rc == -2:
            raise self.engine.failure("the proposal heads")
        if rc != 0:
            raise ValueError("native engine: the model has no proposal heads")
        return out.reshape(n, H).tolist()
