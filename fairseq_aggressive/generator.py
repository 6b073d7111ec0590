"""The aggressive sequence generator: one draft -> verify -> accept loop.

A *drafter* proposes tokens, the *verifier* (the AR model with a rollback-able
key/value cache, :mod:`fairseq_aggressive.verifier`) scores ``[last, draft]`` in
one pass, an *acceptance rule* (:mod:`fairseq_aggressive.acceptance`) decides
how many drafted tokens pass.  The emitted tokens, scores and length handling
follow fairseq's ``SequenceGenerator`` with ``--beam 1`` so that exact rules
give greedy's hypotheses and scores, in the same output format.
"""
import logging
import math
import time
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from .acceptance import AcceptanceRule, ExactAcceptance
from .drafters.base import Drafter
from .options import check_max_draft_len, check_single_model, check_temperature
from .threads import parse_threads, torch_single_threaded
from .verifier import CachedDecoderVerifier

ENGINES = ("auto", "native", "torch")
# default draft cap (Lmax) of open-ended drafters (IAD drafts the whole rest of
# the source) with the native engine: its passes cost little more
# than a greedy step, so positions that are verified but rarely accepted are
# what a long draft wastes (README, "The native engine": Lmax 3-5 are best on
# the shipped model, unlimited drafts are 1.3x slower)
NATIVE_DRAFT_CAP = 4
# with a cost-aware budget and no --max-draft-len, the longest branch it may keep
BUDGET_DRAFT_CAP = 16
# when the budget skips the drafter, one pass in this many drafts anyway (the cost is learnt from them)
BUDGET_EXPLORE = 16
logger = logging.getLogger("fairseq_aggressive")


def pick_engine(engine: str, model, tgt_dict, drafter: Drafter, acceptance: AcceptanceRule,
                threads: Optional[int] = None):
    """The compiled native engine (:mod:`fairseq_aggressive.native`) or None
    for the torch verifier.  ``auto`` takes the native one where it runs: a CPU
    model it supports, an acceptance rule it applies itself (exact or GAD++'s
    top-beta/tau), a drafter that needs neither the encoder output nor the
    verifier's features, a CPU it was built for.  ``threads``: the engine's
    threads (None: :func:`~fairseq_aggressive.threads.engine_threads`' policy)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "torch":
        return None
    from .native import NativeEngine, NativeUnavailable

    try:
        if next(model.parameters()).device.type != "cpu":
            raise NativeUnavailable("the model is not on the CPU")
        if acceptance.native_rank is None:
            raise NativeUnavailable(f"the native engine does not apply {type(acceptance).__name__}")
        if drafter.wants_features:
            raise NativeUnavailable(f"{type(drafter).__name__} reads the verifier's decoder features")
        native = NativeEngine(model, tgt_dict, threads=threads)
        logger.info(f"verifier: the native engine ({native.isa}, {native.threads} thread(s); "
                    f"{native.int8_linears} int8 linear layers, "
                    f"{native.half_linears} stored as float16, their values are float16 values)")
        return native
    except NativeUnavailable as e:
        if engine == "native":
            raise ValueError(f"--engine native: {e}") from e
        logger.info(f"decoding with the torch verifier: {e}")
        return None


def length_cap(max_len_a: float, max_len_b: int, src_len: int, max_positions: int) -> int:
    """Output tokens allowed before EOS is forced, fairseq's rule for a batch
    whose (padded) source length is ``src_len``."""
    return min(int(max_len_a * src_len + max_len_b), max_positions - 1)


class DecodingStats:
    """Counters summed over all batches a generator has decoded."""

    def __init__(self):
        self.sentences = 0
        self.passes = 0  # decoder invocations (one per loop iteration per batch)
        self.sentence_passes = 0  # sum over sentences of the passes they took part in
        self.tokens = 0  # emitted tokens, EOS included
        self.drafted = 0  # drafted positions verified, every branch's
        self.accepted = 0  # drafted tokens that passed
        self.tree_passes = 0  # sentence passes that verified several branches
        self.branch_wins = 0  # ... where a branch other than the first accepted most
        self.draft_seconds = 0.0  # wall time spent in the drafter

    def as_dict(self) -> Dict[str, float]:
        d = dict(vars(self))
        d["mean_tokens_per_pass"] = self.tokens / max(self.sentence_passes, 1)
        d["mean_passes_per_sentence"] = self.sentence_passes / max(self.sentences, 1)
        d["wasted_per_pass"] = (self.drafted - self.accepted) / max(self.sentence_passes, 1)
        return d

    def summary(self) -> str:
        d = self.as_dict()
        return (
            f"{self.sentences} sentences, {self.sentence_passes} decoder passes "
            f"({d['mean_passes_per_sentence']:.2f} per sentence, {self.passes} batched), "
            f"{d['mean_tokens_per_pass']:.2f} tokens accepted per pass, "
            f"{self.accepted}/{self.drafted} drafted tokens accepted"
            + (f", {self.tree_passes} passes over several drafts ({self.branch_wins} kept another than the first)"
               if self.tree_passes else "")
        )


class AggressiveGenerator(nn.Module):
    def __init__(
        self,
        models,
        tgt_dict,
        drafter: Drafter,
        acceptance: Optional[AcceptanceRule] = None,
        max_len_a: float = 0,
        max_len_b: int = 200,
        max_len: int = 0,
        min_len: int = 1,
        normalize_scores: bool = True,
        len_penalty: float = 1.0,
        unk_penalty: float = 0.0,
        temperature: float = 1.0,
        max_draft_len: Optional[int] = None,
        engine: str = "auto",
        shortlist=None,
        draft_cost: Optional[str] = None,
        native_threads=None,
    ):
        super().__init__()
        check_single_model(models)
        check_temperature(temperature)
        max_draft_len = check_max_draft_len(max_draft_len)
        self.model = models[0]
        self.verifier = CachedDecoderVerifier(self.model)
        self.drafter = drafter
        self.acceptance = acceptance or ExactAcceptance()
        if not isinstance(self.acceptance, AcceptanceRule):
            raise TypeError(f"acceptance must be an AcceptanceRule, got {type(self.acceptance).__name__}")
        self.pad, self.unk, self.eos = tgt_dict.pad(), tgt_dict.unk(), tgt_dict.eos()
        self.vocab_size = len(tgt_dict)
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.max_len = max_len or self.model.max_decoder_positions()
        self.min_len = min_len
        self.normalize_scores = normalize_scores
        self.len_penalty = len_penalty
        self.unk_penalty = unk_penalty
        self.temperature = temperature
        self.max_draft_len = max_draft_len
        # approximate: each sentence's output vocabulary (fairseq_aggressive.shortlist)
        self.shortlist = shortlist
        self.stats = DecodingStats()
        # positions projected to the vocabulary before checking (the rule may need more at once)
        self.first_chunk = max(8, self.acceptance.first_chunk_min)
        self.model.eval()
        self.native = pick_engine(engine, self.model, tgt_dict, drafter, self.acceptance,
                                  threads=parse_threads(native_threads))
        # cost-aware draft lengths (fairseq_aggressive.draft_budget): "auto" measures the
        # engine's pass cost on the first batch, "FIXED,PER_POSITION" gives it, None/"off": fixed lengths
        self.budget = None
        self._skipped = 0  # passes in a row the budget skipped the drafter
        if draft_cost not in (None, "off"):
            from .draft_budget import DraftBudget, PassCost

            # a bad value is an error even where no budget applies
            cost = PassCost(1.0, 1.0) if draft_cost == "auto" else PassCost.parse(draft_cost)
            if self.native is not None and drafter.multi_branch:
                self.budget = DraftBudget(cost)
        self._measure_cost = self.budget is not None and draft_cost == "auto"  # on the first batch
        if max_draft_len is None and self.native is not None and drafter.open_ended:
            self.max_draft_len = BUDGET_DRAFT_CAP if self.budget is not None else NATIVE_DRAFT_CAP

    def cuda(self):
        self.model.cuda()
        return self

    def forward(self, sample, prefix_tokens=None, bos_token=None):
        return self.generate([self.model], sample, prefix_tokens=prefix_tokens, bos_token=bos_token)

    # ---------------------------------------------------------------- scoring
    def _scores(self, features: Tensor, positions: Tensor, max_len: int, allowed: Optional[Tensor] = None):
        """Adjusted scores for choosing tokens and the log-probs to report, the
        same adjustments as SequenceGenerator (pad never, unk penalty, forced EOS
        at max_len, no EOS before min_len).  ``positions`` (B, T) are the output
        steps the rows predict; ``allowed`` (B, V), the shortlist of each row."""
        logits = self.verifier.output_layer(features).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if allowed is not None:
            logits = logits.masked_fill(~allowed.unsqueeze(1), -math.inf)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        logits[..., self.pad] = -math.inf
        if self.unk_penalty:
            logits[..., self.unk] -= self.unk_penalty
        at_max = positions >= max_len
        if bool(at_max.any()):
            eos_col = logits[..., self.eos].clone()
            logits[at_max] = -math.inf
            logits[..., self.eos] = eos_col
        if self.min_len > 0:
            logits[..., self.eos] = logits[..., self.eos].masked_fill(
                positions < self.min_len, -math.inf
            )
        return logits, lse

    def _verify(self, feats: Tensor, tokens: Tensor, n_draft: Tensor, positions: Tensor, max_len: int,
                allowed: Optional[Tensor] = None):
        """Choose tokens position chunk by position chunk (8, 16, 32, ...) and
        stop once every sentence has met its first rejection: the vocabulary
        projection of positions after it is never computed.  Returns the
        choices and log-probs of the positions computed and ``n_match``."""
        B, T = tokens.shape
        draft = torch.cat([tokens[:, 1:], tokens.new_full((B, 1), self.pad)], dim=1)
        choices, scores = [], []
        n_match = torch.zeros_like(n_draft)
        lo, size = 0, self.first_chunk
        while lo < T:
            hi = min(T, lo + size)
            adjusted, lse = self._scores(feats[:, lo:hi], positions[:, lo:hi], max_len, allowed)
            n_valid = (n_draft - lo).clamp(min=0)
            choice, m = self.acceptance(adjusted, draft[:, lo:hi], n_valid, lo)
            choices.append(choice)
            scores.append(adjusted.gather(2, choice.unsqueeze(2)).squeeze(2) - lse.squeeze(2))
            n_match = torch.where(n_match == lo, n_match + m, n_match)
            if hi == T or not bool((n_match == hi).any()):
                break
            lo, size = hi, size * 2
        return torch.cat(choices, dim=1), torch.cat(scores, dim=1), n_match

    def _torch_pass(self, state, active: List[int], rows: List[List[int]], max_len: int,
                    allowed: Optional[Tensor] = None):
        """One pass of the torch verifier over ``rows`` = [last] + draft: per
        row the emitted tokens (accepted drafts + the verifier's token at the
        bifurcation, cut after the first EOS), their scores, the accepted
        draft length and whether EOS was emitted; commits the cache."""
        device = state.lengths.device
        width = max(len(r) for r in rows)
        tokens = torch.tensor([r + [self.pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
        n_draft = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long, device=device)
        feats = self.verifier.forward(state, tokens, n_draft + 1)
        positions = state.lengths.unsqueeze(1) + torch.arange(width, device=device)
        if allowed is not None:
            allowed = allowed[torch.tensor(active, dtype=torch.long, device=device)]
        choice, tok_scores, n_match = self._verify(feats, tokens, n_draft, positions, max_len, allowed)
        n_emit = n_match + 1
        steps = torch.arange(choice.size(1), device=device).unsqueeze(0)
        is_eos = (choice == self.eos) & (steps < n_emit.unsqueeze(1))
        done = is_eos.any(dim=1)
        n_emit = torch.where(done, is_eos.long().argmax(dim=1) + 1, n_emit)
        self.verifier.commit(state, n_emit)
        if self.drafter.wants_features:  # merged verify/predict (blockwise heads)
            t0 = time.perf_counter()
            self.drafter.observe(active, feats, n_emit)
            self.stats.draft_seconds += time.perf_counter() - t0
        if self.drafter.wants_emitted_features:
            t0 = time.perf_counter()
            emitted = torch.arange(width, device=device).unsqueeze(0) < n_emit.unsqueeze(1)
            self.drafter.observe_emitted(active, feats[emitted], n_emit.tolist())
            self.stats.draft_seconds += time.perf_counter() - t0
        choice_l, score_l, n_emit_l = choice.tolist(), tok_scores.tolist(), n_emit.tolist()
        emit = [c[:k] for c, k in zip(choice_l, n_emit_l)]
        emit_scores = [sc[:k] for sc, k in zip(score_l, n_emit_l)]
        return emit, emit_scores, n_match.tolist(), done.tolist()

    # ------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, bos_token=None, **kwargs):
        if prefix_tokens is not None:
            raise ValueError("aggressive decoding does not support prefix tokens (--prefix-size)")
        if constraints is not None:
            raise ValueError("aggressive decoding does not support lexical constraints")
        src_tokens = sample["net_input"]["src_tokens"]
        src_len = src_tokens.size(1)
        max_len = length_cap(self.max_len_a, self.max_len_b, src_len, self.max_len)
        if self.min_len > max_len:
            raise ValueError("min_len cannot be larger than max_len, please adjust these!")

        native = self.native  # None, or off for this batch if on a GPU or beyond its position tables
        if native is not None and (src_tokens.device.type != "cpu" or not native.can_decode(src_len, max_len)):
            native = None
        if native is None:
            return self._decode(sample, native, max_len, bos_token)
        with torch_single_threaded():  # torch's idle OpenMP workers would take turns with the engine's
            return self._decode(sample, native, max_len, bos_token)

    def _decode(self, sample, native, max_len: int, bos_token=None):
        """The draft -> verify -> accept loop over one batch, on ``native`` (a
        :class:`~fairseq_aggressive.native.NativeEngine`) or, if None, the torch verifier."""
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz = src_tokens.size(0)
        device = src_tokens.device
        branching = self.drafter.multi_branch
        if native is not None:
            if self._measure_cost:
                from .draft_budget import measure_pass_cost

                self.budget.reset(measure_pass_cost(native, src_tokens))
                self._measure_cost = False
                logger.info(f"draft budget: a pass costs {self.budget.cost}")
            room = 0
            if branching and self.drafter.max_branches > 1:
                room = (self.drafter.max_branches - 1) * (self.max_draft_len if self.max_draft_len is not None
                                                          else max_len)
            state = native.begin(src_tokens, max_len, self.shortlist, tree_room=room)
            encoder_out = state.encoder_out() if self.drafter.needs_encoder_out else None
            allowed = None
        else:
            encoder_out = self.verifier.encode(net_input)
            state = self.verifier.begin(encoder_out, max_len + 1)
            allowed = None if self.shortlist is None else self.shortlist.allowed(src_tokens)
        t0 = time.perf_counter()
        self.drafter.batch_max_len = max_len
        self.drafter.begin(sample, encoder_out)
        self.stats.draft_seconds += time.perf_counter() - t0

        outputs: List[List[int]] = [[] for _ in range(bsz)]
        scores: List[List[float]] = [[] for _ in range(bsz)]
        active = list(range(bsz))
        last = [self.eos if bos_token is None else bos_token] * bsz
        lmax = self.max_draft_len
        stats = self.stats
        self.last_sentence_passes = sent_passes = [0] * bsz  # passes each sentence took part in
        stats.sentences += bsz

        learn_cost = self.budget is not None and self.budget.cost.measured and native is not None
        while active:
            t_pass = time.perf_counter()
            caps = [max_len - len(outputs[b]) for b in active]
            if lmax is not None:
                caps = [min(c, lmax) for c in caps]
            t0 = time.perf_counter()
            if branching:
                drafts, kept, blens = self._branches(active, outputs, caps, several=native is not None)
            else:
                drafts = self.drafter.propose_batch(active, [outputs[b] for b in active], caps)
            stats.draft_seconds += time.perf_counter() - t0
            rows = [[last[b]] + d for b, d in zip(active, drafts)]
            won = [0] * len(active)
            if native is not None:
                emit, emit_scores, n_match, done, won = state.step(
                    active, rows, max_len, self.min_len, self.unk_penalty, self.temperature,
                    branches=blens if branching else None, features=self.drafter.wants_emitted_features,
                    beta=self.acceptance.native_rank[0], tau=self.acceptance.native_rank[1])
                if self.drafter.wants_emitted_features:
                    t0 = time.perf_counter()
                    self.drafter.observe_emitted(active, state.features, [len(e) for e in emit])
                    stats.draft_seconds += time.perf_counter() - t0
            else:
                emit, emit_scores, n_match, done = self._torch_pass(state, active, rows, max_len, allowed)
            n_draft = [len(d) for d in drafts]
            if branching:  # the kept branch, as the drafter numbered them, and its length
                for i, w in enumerate(won):
                    if len(kept[i]) > 1:
                        stats.tree_passes += 1
                        stats.branch_wins += w > 0
                    won[i] = kept[i][w]
                    n_draft[i] = blens[i][w]
            stats.passes += 1
            stats.sentence_passes += len(active)
            stats.drafted += sum(len(d) for d in drafts)  # every branch's positions
            stats.accepted += sum(n_match)
            keep = []
            for i, b in enumerate(active):
                sent_passes[b] += 1
                outputs[b].extend(emit[i])
                scores[b].extend(emit_scores[i])
                if done[i]:
                    continue
                keep.append(i)
                last[b] = outputs[b][-1]
                if branching:
                    self.drafter.update(b, outputs[b], n_draft[i], n_match[i], branch=won[i])
                else:  # (drafters written before branches take four arguments)
                    self.drafter.update(b, outputs[b], n_draft[i], n_match[i])
            if learn_cost:  # the whole iteration, Python included, is what a pass costs
                self.budget.observe(sum(len(r) for r in rows), time.perf_counter() - t_pass)
            if len(keep) < len(active):
                active = [active[i] for i in keep]
                if active and native is None:
                    state.select(torch.tensor(keep, dtype=torch.long, device=device))

        return [self._finalize(outputs[b], scores[b], device) for b in range(bsz)]

    def _branches(self, active: List[int], outputs, caps: List[int], several: bool):
        """The drafter's branches for a pass, shortened by the budget if there
        is one (only the first branch per sentence unless ``several``): per row
        the concatenated drafts, the drafter's indices of the branches kept and
        their lengths."""
        if (self.budget is not None and several and self._skipped < BUDGET_EXPLORE - 1
                and not self.budget.pays(len(active), self.drafter.best_gains(max(caps)))):
            # drafts cannot pay for the drafter and their positions: greedy's pass without the
            # drafter (its update() sees nothing proposed and re-anchors later from the output);
            # every BUDGET_EXPLORE-th pass in a row drafts anyway, so that the cost keeps being learnt
            self._skipped += 1
            return [[] for _ in active], [[0] for _ in active], [[0] for _ in active]
        self._skipped = 0
        t0 = time.perf_counter()
        cands = self.drafter.propose_branches(active, [outputs[b] for b in active], caps)
        if not several:  # the torch verifier takes one draft
            for c in cands:
                for br in c[1:]:
                    del br.tokens[:]
        if self.budget is not None:
            for c, lengths in zip(cands, self.budget.select(cands)):
                for br, n in zip(c, lengths):
                    del br.tokens[n:]
            if several and self.budget.cost.measured:  # what asking the drafter costs per row
                self.budget.observe_drafter(len(active), time.perf_counter() - t0)
        drafts, kept, blens = [], [], []
        for c in cands:
            idx = [i for i, br in enumerate(c) if br.tokens] or [0]
            kept.append(idx)
            blens.append([len(c[i].tokens) for i in idx])
            drafts.append([t for i in idx for t in c[i].tokens])
        return drafts, kept, blens

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
