"""The aggressive sequence generator: one draft -> verify -> accept loop.

A *drafter* (:mod:`fairseq_aggressive.drafters`) proposes tokens, a *verifier*
(:mod:`fairseq_aggressive.verifiers`: the AR model with a rollback-able
key/value cache, on torch or on the native engine) scores ``[last, draft]`` in
one pass and applies an *acceptance rule* (:mod:`fairseq_aggressive.acceptance`)
that decides how many drafted tokens pass.  The emitted tokens, scores and
length handling follow fairseq's ``SequenceGenerator`` with ``--beam 1`` so that
exact rules give greedy's hypotheses and scores, in the same output format.
"""
import logging
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from .acceptance import AcceptanceRule, ExactAcceptance
from .draft_policy import build_draft_policy
from .drafters.base import Drafter, DraftOutcome
from .engines import build_verifier
from .options import check_isa, check_max_draft_len, check_single_model, check_temperature
from .stats import DecodingStats
from .runtime.threads import parse_threads
from .verifiers import ScoreRules

logger = logging.getLogger("fairseq_aggressive")


def length_cap(max_len_a: float, max_len_b: int, src_len: int, max_positions: int) -> int:
    """Output tokens allowed before EOS is forced, fairseq's rule for a batch
    whose (padded) source length is ``src_len``."""
    return min(int(max_len_a * src_len + max_len_b), max_positions - 1)


_NOTED = set()


def _note_per_pass_loop(drafter) -> None:
    """Says once per drafter class that its batches take the generator's loop
    where the verifier could run a loop in its engine."""
    name = type(drafter).__name__
    if name not in _NOTED:
        _NOTED.add(name)
        logger.info(f"{name} drafts from Python here (no loop of its own in the engine: "
                    f"Drafter.decode_in_engine): one engine call and a Python round trip per pass, where the "
                    f"engine's loops (IAD, GAD, feature-ar, blockwise) decode a batch in one call; the output is "
                    f"the same")


@dataclass(frozen=True)
class OutputRules:
    """fairseq ``SequenceGenerator``'s length and score options: an output of
    at most ``max_len_a`` * source length + ``max_len_b`` tokens (and below
    ``max_len``, the model's positions when 0), its score divided by
    length ** ``len_penalty`` where ``normalize_scores``."""

    max_len_a: float = 0
    max_len_b: int = 200
    max_len: int = 0
    normalize_scores: bool = True
    len_penalty: float = 1.0


class AggressiveGenerator(nn.Module):
    """The loop over built parts: ``drafter`` proposes, ``verifier``
    (:func:`~fairseq_aggressive.engines.build_verifier`, which carries the
    acceptance rule and fairseq's score rules) checks, ``draft_policy``
    (:func:`~fairseq_aggressive.draft_policy.build_draft_policy`) says how long
    drafts are; ``output`` (:class:`OutputRules`) holds ``SequenceGenerator``'s
    length and score options; ``max_draft_len`` (a cap on each draft; None: the
    policy's default for open-ended drafters) and ``engine_loop`` (where the
    verifier can run the drafter's whole loop in its engine, as the native
    engine does for IAD with one branch, greedy search, the feature drafter
    and blockwise heads: let it, one call per batch; False: this generator's
    loop, one call per pass; the same output either way).
    :func:`build_generator` builds the parts from engine options (the Python
    API's convenience); ``fairseq-generate``'s path builds them from its
    checked options (:mod:`fairseq_aggressive.decoding`)."""

    def __init__(
        self,
        models,
        tgt_dict,
        drafter: Drafter,
        verifier,
        draft_policy,
        output: Optional["OutputRules"] = None,
        max_draft_len: Optional[int] = None,
        engine_loop: bool = True,
    ):
        super().__init__()
        check_single_model(models)
        max_draft_len = check_max_draft_len(max_draft_len)
        self.model = models[0]
        self.drafter = drafter
        self.eos = tgt_dict.eos()
        out = output or OutputRules()
        self.max_len_a, self.max_len_b = out.max_len_a, out.max_len_b
        self.max_len = out.max_len or self.model.max_decoder_positions()
        self.normalize_scores = out.normalize_scores
        self.len_penalty = out.len_penalty
        self.max_draft_len = max_draft_len
        self.engine_loop = engine_loop
        self.stats = DecodingStats()
        self.model.eval()
        self.verifier = verifier
        self.acceptance = verifier.acceptance
        self.min_len = verifier.rules.min_len
        self.policy = draft_policy
        if max_draft_len is None and drafter.caps.open_ended:
            self.max_draft_len = self.policy.default_cap(self.verifier)

    @property
    def native(self):
        """The native engine the verifier runs on (None: torch)."""
        return self.verifier.engine

    def cuda(self):
        self.model.cuda()
        return self

    def forward(self, sample, prefix_tokens=None, bos_token=None):
        return self.generate([self.model], sample, prefix_tokens=prefix_tokens, bos_token=bos_token)

    # ------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, bos_token=None, **kwargs):
        if prefix_tokens is not None:
            raise ValueError("aggressive decoding does not support prefix tokens (--prefix-size)")
        if constraints is not None:
            raise ValueError("aggressive decoding does not support lexical constraints")
        src_len = sample["net_input"]["src_tokens"].size(1)
        max_len = length_cap(self.max_len_a, self.max_len_b, src_len, self.max_len)
        if self.min_len > max_len:
            raise ValueError("min_len cannot be larger than max_len, please adjust these!")
        caps = self.drafter.caps
        room = 0  # cache positions a pass over several branches may use beyond a plain row
        if caps.branches and caps.max_branches > 1:
            room = (caps.max_branches - 1) * (self.max_draft_len if self.max_draft_len is not None else max_len)
        self.verifier.begin(sample, max_len, tree_room=room)
        with self.verifier.running():
            return self._decode(sample, max_len, bos_token)

    def _decode(self, sample, max_len: int, bos_token=None):
        """The draft -> verify -> accept loop over one batch the verifier has begun."""
        if self.engine_loop and self.policy.whole_drafts:  # the drafter's loop inside the verifier's engine
            first = self.eos if bos_token is None else bos_token
            kw = dict(budget=True) if self.policy.engine_budget else {}
            done = self.drafter.decode_in_engine(self.verifier, sample, max_len, first, self.max_draft_len, **kw)
            if done is not None:
                return self._from_engine_loop(sample, done)
            if self.verifier.runs_engine_loops:
                _note_per_pass_loop(self.drafter)
        src_tokens = sample["net_input"]["src_tokens"]
        bsz = src_tokens.size(0)
        device = src_tokens.device
        verifier, drafter, caps = self.verifier, self.drafter, self.drafter.caps
        several = verifier.takes_branches
        self.policy.begin(verifier, src_tokens, several)
        t0 = time.perf_counter()
        drafter.begin(sample, max_len, verifier.encoder_out() if caps.encoder_out else None)
        self.stats.draft_seconds += time.perf_counter() - t0

        outputs: List[List[int]] = [[] for _ in range(bsz)]
        scores: List[List[float]] = [[] for _ in range(bsz)]
        active = list(range(bsz))
        last = [self.eos if bos_token is None else bos_token] * bsz
        lmax = self.max_draft_len
        stats = self.stats
        self.last_sentence_passes = sent_passes = [0] * bsz  # passes each sentence took part in
        stats.sentences += bsz

        while active:
            t_pass = time.perf_counter()
            lens = [max_len - len(outputs[b]) for b in active]
            if lmax is not None:
                lens = [min(c, lmax) for c in lens]
            drafts, kept, blens, verified = self._propose(active, outputs, lens, several)
            rows = [[last[b]] + d for b, d in zip(active, drafts)]
            res = verifier.step(active, rows, branches=blens if caps.branches and several else None,
                                emitted_features=caps.emitted_features, pass_features=caps.pass_features)
            n_emit = [len(e) for e in res.emit]
            t0 = time.perf_counter()
            if caps.pass_features:  # merged verify/predict (blockwise heads)
                drafter.observe(active, res.pass_features, n_emit)
            if caps.emitted_features:
                drafter.observe_emitted(active, res.emitted_features, n_emit)
            stats.draft_seconds += time.perf_counter() - t0
            stats.passes += 1
            stats.sentence_passes += len(active)
            stats.drafted += sum(len(d) for d in drafts)  # every branch's positions
            stats.accepted += sum(res.n_match)
            keep = []
            for i, b in enumerate(active):
                won = kept[i][res.kept[i]]  # the kept branch, as the drafter numbered them
                n_draft = verified[i][won] if verified[i] else 0
                stats.add_draft(n_draft, res.n_match[i])
                if len(kept[i]) > 1:
                    stats.tree_passes += 1
                    stats.branch_wins += res.kept[i] > 0
                sent_passes[b] += 1
                outputs[b].extend(res.emit[i])
                scores[b].extend(res.scores[i])
                if res.done[i]:
                    continue
                keep.append(i)
                last[b] = outputs[b][-1]
                drafter.update(b, outputs[b], DraftOutcome(verified[i], won, res.n_match[i]))
            # the whole iteration, Python included, is what a pass costs
            self.policy.observe_pass(sum(len(r) for r in rows), time.perf_counter() - t_pass, several)
            active = [active[i] for i in keep]

        return [self._finalize(outputs[b], scores[b], device) for b in range(bsz)]

    def _from_engine_loop(self, sample, done):
        """The hypotheses and counters of a batch a loop in the engine decoded
        (:meth:`~fairseq_aggressive.drafters.base.Drafter.decode_in_engine`)."""
        self.stats.sentences += len(done.tokens)
        self.stats.add_loop(done.stats)
        self.last_sentence_passes = done.passes
        device = sample["net_input"]["src_tokens"].device
        return [self._finalize(t, s, device) for t, s in zip(done.tokens, done.scores)]

    def _propose(self, active: List[int], outputs, lens: List[int], several: bool):
        """The drafter's branches for a pass, shortened by the draft policy
        (only the first branch per sentence unless ``several``): per row the
        concatenated drafts, the drafter's indices of the branches kept, their
        lengths, and the length verified of every branch proposed."""
        if self.policy.skips_drafter(len(active), self.drafter, max(lens), several):
            return [[] for _ in active], [[0] for _ in active], [[0] for _ in active], [[] for _ in active]
        t0 = time.perf_counter()
        cands = self.drafter.propose(active, [outputs[b] for b in active], lens)
        self.stats.draft_seconds += time.perf_counter() - t0
        lengths = self.policy.lengths(cands, len(active), t0, several)
        drafts, kept, blens, verified = [], [], [], []
        for c, n in zip(cands, lengths):
            if not several:  # the verifier takes one draft: the first
                n = n[:1] + [0] * (len(n) - 1)
            idx = [i for i, k in enumerate(n) if k] or [0]
            kept.append(idx)
            blens.append([n[i] for i in idx])
            drafts.append([t for i in idx for t in c[i].tokens[: n[i]]])
            verified.append(list(n))
        return drafts, kept, blens, verified

    def _finalize(self, toks: List[int], pos_scores: List[float], device) -> List[Dict[str, Tensor]]:
        self.stats.tokens += len(toks)
        tokens = torch.tensor(toks, dtype=torch.long, device=device)
        positional = torch.tensor(pos_scores, dtype=torch.float, device=device)
        score = positional.sum()
        if self.normalize_scores:
            score = score / (len(toks) ** self.len_penalty)
        return [
            {
                "tokens": tokens,
                "score": score,
                "attention": torch.empty(0),
                "alignment": torch.empty(0),
                "positional_scores": positional,
            }
        ]


def build_generator(models, tgt_dict, drafter: Drafter, acceptance: Optional[AcceptanceRule] = None,
                    min_len: int = 1, unk_penalty: float = 0.0, temperature: float = 1.0, engine: str = "auto",
                    shortlist=None, draft_cost: Optional[str] = None, native_threads=None, native_isa=None,
                    native_share=None, engine_loop: bool = True, forced_first: Optional[int] = None,
                    **loop_options) -> AggressiveGenerator:
    """An :class:`AggressiveGenerator` with its parts built here: the verifier of
    ``engine`` (:func:`~fairseq_aggressive.engines.build_verifier`) under
    ``acceptance`` (exact by default) and fairseq's score rules (``min_len``,
    ``unk_penalty``, ``temperature``, ``forced_first``: the token every output
    starts with, as an imported model's target language token), with ``shortlist`` (a
    :class:`~fairseq_aggressive.shortlist.VocabShortlist`), ``native_threads``
    (``auto`` or a count), ``native_isa`` (the engine's build target: ``auto``
    or a name, :mod:`~fairseq_aggressive.native.targets`) and ``native_share``
    (another generator's :attr:`~AggressiveGenerator.native` engine made from
    the same model: this one reads its weights instead of a copy of its own,
    so that several generators decode on separate threads at the memory of
    one); the draft policy of ``draft_cost`` (``auto``, ``FIXED,PER_POSITION``,
    None or ``off``: :func:`~fairseq_aggressive.draft_policy.build_draft_policy`).
    ``loop_options`` and ``engine_loop`` are the generator's own."""
    check_single_model(models)
    check_temperature(temperature)
    acceptance = acceptance or ExactAcceptance()
    if not isinstance(acceptance, AcceptanceRule):
        raise TypeError(f"acceptance must be an AcceptanceRule, got {type(acceptance).__name__}")
    if forced_first is not None and shortlist is not None:
        raise ValueError("a vocabulary shortlist with a forced first token (an imported model's language token) "
                         "is not supported")
    rules = ScoreRules(tgt_dict.pad(), tgt_dict.unk(), tgt_dict.eos(), min_len, unk_penalty, temperature,
                       forced_first)
    verifier = build_verifier(engine, models[0], tgt_dict, acceptance, rules,
                              wants_pass_features=drafter.caps.pass_features, shortlist=shortlist,
                              threads=parse_threads(native_threads), isa=check_isa(native_isa), share=native_share)
    policy = build_draft_policy(draft_cost, verifier, drafter, engine_loop)
    max_draft_len = loop_options.pop("max_draft_len", None)
    return AggressiveGenerator(models, tgt_dict, drafter, verifier, policy, OutputRules(**loop_options),
                               max_draft_len=max_draft_len, engine_loop=engine_loop)
