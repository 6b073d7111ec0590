"""Input-guided drafter (IAD / Shallow Aggressive Decoding, Sun et al. 2021).

The draft is a copy of the source.  After a rejection the paper's drafter
decodes one token per pass (empty drafts) until the suffix of the output
matches a unique place in the source, and copying resumes right after it
(``branches=1``, the default of :class:`InputCopyDrafter`).

With ``branches > 1`` (multi-branch re-anchoring) the drafter instead proposes,
in the pass right after the rejection, several copies at once, one per
plausible alignment of the source after the edit: if the divergence began at
source position q and the output has k tokens since, the edit replaced j
source tokens for j = k (a substitution), k - 1 or k - 2 (insertions), k + 1
or k + 2 (deletions), so copying resumes at q + j; plus the unique-suffix
place.  The native engine verifies all of them in one pass (a tree row) and
keeps the cache of the branch that accepted most; the output stays greedy's.

Each branch carries the expected tokens each of its positions adds (its
``gains``): the drafter counts, over everything it decodes, how often a branch
of each kind has its first token accepted and how often a token after an
accepted one is accepted too (and the latter for each sentence, with the
overall rate as its prior).  A cost-aware budget
(:mod:`fairseq_aggressive.draft_budget`) uses them to choose lengths.
"""
from typing import Dict, List, Optional, Tuple

import torch

from ..runtime.token_rows import unpadded
from .base import Branch, Drafter, DrafterCaps, DraftOutcome, EngineDrafter, LoopResult, drafts_as

# alignments tried after an edit: (kind, source tokens replaced minus output tokens emitted since)
OFFSETS = (("sub", 0), ("ins", -1), ("del", 1), ("ins2", -2), ("del2", 2))
# prior rates of a first token accepted, per kind of branch, and of a token after an accepted one
PRIORS = {"copy": 0.8, "sync": 0.5, "sub": 0.3, "ins": 0.15, "del": 0.15, "ins2": 0.05, "del2": 0.05}
CONTINUE_PRIOR = 0.85
PRIOR_WEIGHT = 4.0
# offsets are tried until this many tokens have been emitted since the divergence
MAX_SINCE = 4


class _Rate:
    """A success rate with a prior worth ``PRIOR_WEIGHT`` observations."""

    __slots__ = ("hits", "trials", "prior")

    def __init__(self, prior: float):
        self.hits, self.trials, self.prior = 0.0, 0.0, prior

    def add(self, hits: float, trials: float) -> None:
        self.hits += hits
        self.trials += trials

    @property
    def value(self) -> float:
        return self.given(self.prior)

    def given(self, prior: float) -> float:
        """The rate with another prior (a sentence's own, with the overall rate as its prior)."""
        return (self.hits + prior * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)


class InputCopyDrafter(Drafter):

    def __init__(self, src_dict, tgt_dict, ngram_min: int = 1, ngram_max: int = 4, branches: int = 1):
        from ..options import check_iad_branches

        if ngram_min < 1 or ngram_max < ngram_min:
            raise ValueError(
                f"--iad-ngram-min/--iad-ngram-max must satisfy 1 <= min <= max, "
                f"got {ngram_min}..{ngram_max}"
            )
        self.pad = src_dict.pad()
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # (one branch: the paper's drafts, with gains for a budget)
        self.caps = DrafterCaps(open_ended=True, branches=True, max_branches=check_iad_branches(branches))
        # map source ids to target ids (identity for a joined dictionary)
        self.src_to_tgt: Optional[torch.Tensor] = None
        if src_dict.symbols != tgt_dict.symbols:
            self.src_to_tgt = torch.tensor(
                [tgt_dict.index(sym) for sym in src_dict.symbols], dtype=torch.long
            )
            self.src_to_tgt[src_dict.eos()] = tgt_dict.eos()
        self.src: List[List[int]] = []
        self.ptr: List[Optional[int]] = []  # copying: the next source position to draft
        self.anchor: List[Optional[int]] = []  # after an edit: the source position it began at
        self.since: List[int] = []  # output tokens emitted since that edit began
        self._proposed: Dict[int, List[Tuple[Branch, int]]] = {}  # sentence -> (branch, source start)
        self._index: Dict[int, Dict[Tuple[int, ...], int]] = {}
        self.first = {kind: _Rate(p) for kind, p in PRIORS.items()}
        self.cont = _Rate(CONTINUE_PRIOR)  # over everything decoded
        self.sent_cont: List[_Rate] = []  # per sentence of the batch (its prior: self.cont)
        self.wins: Dict[str, int] = {kind: 0 for kind in PRIORS}  # passes each kind of branch was kept

    def begin(self, sample, max_len: int, encoder_out=None) -> None:
        src_tokens = sample["net_input"]["src_tokens"].cpu()
        if self.src_to_tgt is not None:
            src_tokens = self.src_to_tgt[src_tokens]
        keep = sample["net_input"]["src_tokens"].cpu().ne(self.pad)
        self.src = [row[m].tolist() for row, m in zip(src_tokens, keep)]
        self.ptr = [0] * len(self.src)
        self.anchor = [None] * len(self.src)
        self.since = [0] * len(self.src)
        self.sent_cont = [_Rate(CONTINUE_PRIOR) for _ in self.src]
        self._proposed = {}
        self._index = {}

    # ------------------------------------------------- the loop in the engine
    def copy_loop(self) -> Optional[Tuple[int, int]]:
        # one draft per pass: a verifier that runs the loop makes exactly these drafts, unless a
        # subclass drafts otherwise or copies other sources than copy_source() gives
        cls, base = type(self), InputCopyDrafter
        drafts_as_here = drafts_as(self, base, ("propose", "update", "_starts", "_resync"))
        sources_known = cls.begin is base.begin or cls.copy_source is not base.copy_source
        if self.caps.max_branches == 1 and drafts_as_here and sources_known:
            return self.ngram_min, self.ngram_max
        return None

    def decode_in_engine(self, verifier, sample, max_len: int, first: int, max_draft, budget: bool = False):
        spec = self.engine_drafter(verifier)
        if spec is None or not verifier.runs_engine_loops:
            return None
        toks, scores, passes, st = verifier.decode_in_engine(spec.kind, first, max_draft, budget=budget,
                                                             copy=self.copy_source(sample), **spec.settings)
        self.learn_from_loop(st.copy)
        return LoopResult(toks, scores, passes, st.loop)

    def engine_budget(self) -> bool:
        return self.copy_loop() is not None

    def engine_drafter(self, verifier) -> Optional[EngineDrafter]:
        ngrams = self.copy_loop()
        if ngrams is None:
            return None
        return EngineDrafter("copy", dict(ngram_min=ngrams[0], ngram_max=ngrams[1]), copies=True)

    def copy_source(self, sample):
        """Each sentence's copy source (target ids, padding removed), concatenated,
        and their lengths: int32 arrays for a verifier's own loop."""
        flat, lengths, _ = unpadded(sample["net_input"]["src_tokens"], self.pad, self.src_to_tgt)
        return flat, lengths

    def learn_from_loop(self, stats) -> None:
        """What a verifier's own loop counted (its RunStats' CopyRates) goes into the
        rates :meth:`update` learns."""
        self.first["copy"].add(stats.copy_hits, stats.copy_trials)
        self.first["sync"].add(stats.sync_hits, stats.sync_trials)
        self.wins["copy"] += stats.copy_hits
        self.wins["sync"] += stats.sync_hits
        self.cont.add(stats.cont_hits, stats.cont_trials)

    # --------------------------------------------------------------- drafts
    def _starts(self, sent: int, output: List[int]) -> List[Tuple[str, int]]:
        """(kind, source position) of every copy to draft, most likely first."""
        if self.ptr[sent] is not None:
            return [("copy", self.ptr[sent])]
        src = self.src[sent]
        starts = []
        sync = self._resync(sent, output)
        if sync is not None:
            starts.append(("sync", sync))
        q, k = self.anchor[sent], self.since[sent]
        if self.caps.max_branches > 1 and q is not None and k <= MAX_SINCE:
            starts += [(kind, q + k + d) for kind, d in OFFSETS if k + d >= 0 and q + k + d < len(src)]
        starts.sort(key=lambda s: -self.first[s[0]].value)  # stable: sync before an equal offset
        kept, seen_pos, seen_tok = [], set(), set()
        for kind, r in starts:
            if r in seen_pos or src[r] in seen_tok:  # one branch per first token: they exclude each other
                continue
            seen_pos.add(r)
            seen_tok.add(src[r])
            kept.append((kind, r))
        return kept[: self.caps.max_branches]

    def propose(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        glob = self.cont.value
        out = []
        for sent, output, cap in zip(sents, outputs, caps):
            alpha = self.sent_cont[sent].given(glob)  # this sentence's own rate, the global one as its prior
            branches = []
            for kind, r in (self._starts(sent, output) if cap > 0 else []):
                tokens = self.src[sent][r : r + cap]
                p = self.first[kind].value
                gains = [p * alpha ** i for i in range(len(tokens))]
                branches.append((Branch(tokens, gains, kind), r))
            self._proposed[sent] = branches
            out.append([b for b, _ in branches] or [Branch([], [], "none")])
        return out

    def best_gains(self, n: int) -> List[float]:
        p, alpha = max(rate.value for rate in self.first.values()), self.cont.value
        return [p * alpha ** i for i in range(n)]

    # -------------------------------------------------------------- results
    def update(self, sent: int, output: List[int], outcome: DraftOutcome) -> None:
        proposed = self._proposed.pop(sent, [])
        branch, n_match, n_draft = outcome.kept, outcome.n_match, outcome.n_draft
        verified = list(outcome.verified) + [0] * (len(proposed) - len(outcome.verified))
        src = self.src[sent]
        for i, (br, _) in enumerate(proposed):  # first-token statistics of the branches verified
            if verified[i]:
                self.first[br.kind].add(float(i == branch and n_match >= 1), 1.0)
        if n_match >= 1:  # tokens after an accepted one
            hits, trials = n_match - 1, n_match - 1 + (n_match < n_draft)
            self.cont.add(hits, trials)
            self.sent_cont[sent].add(hits, trials)
        if not proposed:  # nothing to copy: one more token since the edit
            self.ptr[sent] = None
            self.since[sent] += 1
            return
        br, r = proposed[branch]
        if not n_draft:  # no position verified (a budget dropped them): the token emitted may continue a copy
            for _, r2 in proposed:
                if r2 < len(src) and output[-1] == src[r2]:
                    return self._copy_from(sent, r2 + 1)
        elif n_match >= 1:
            self.wins[br.kind] += 1
        nxt = r + n_match
        if n_draft and n_match == n_draft and nxt < len(src) and output[-1] == src[nxt]:
            return self._copy_from(sent, nxt + 1)  # the verifier's own next token continues the copy
        self.ptr[sent] = None
        if n_match >= 1 or br.kind == "copy":  # a new edit begins where this branch stopped
            self.anchor[sent], self.since[sent] = nxt, 1
        else:  # every branch failed at its first token
            self.since[sent] += 1

    def _copy_from(self, sent: int, p: int) -> None:
        """Copy on from source position ``p`` (its end: an edit may still follow)."""
        src_len = len(self.src[sent])
        self.ptr[sent] = p if p < src_len else None
        self.anchor[sent] = None if p < src_len else src_len
        self.since[sent] = 0

    # ---------------------------------------------------------- re-anchoring
    def _resync(self, sent: int, output: List[int]) -> Optional[int]:
        """Source position right after the unique occurrence of the output's
        suffix (shortest n-gram in the range that is unique), or None."""
        index = self._index.get(sent)
        if index is None:
            index = self._index[sent] = self._build_index(self.src[sent])
        src_len = len(self.src[sent])
        for n in range(self.ngram_min, min(self.ngram_max, len(output)) + 1):
            end = index.get(tuple(output[-n:]))
            if end is None:  # no occurrence: longer suffixes cannot occur either
                return None
            if end >= 0:  # unique occurrence
                return end if end < src_len else None
        return None

    def _build_index(self, src: List[int]) -> Dict[Tuple[int, ...], int]:
        """n-gram -> end position if it occurs once in ``src``, -1 if more often."""
        index: Dict[Tuple[int, ...], int] = {}
        for n in range(self.ngram_min, self.ngram_max + 1):
            for end in range(n, len(src) + 1):
                key = tuple(src[end - n : end])
                index[key] = -1 if key in index else end
        return index


def build_iad(opts, task, models):
    """``--decoding iad``: (the drafter, exact acceptance)."""
    from ..acceptance import build_acceptance

    drafter = InputCopyDrafter(task.source_dictionary, task.target_dictionary, ngram_min=opts.iad_ngram_min,
                               ngram_max=opts.iad_ngram_max, branches=opts.iad_branches)
    return drafter, build_acceptance()
