"""The torch verifier: the model's own modules over a rollback-able cache
(:class:`~fairseq_aggressive.verifiers.cached_decoder.CachedDecoderVerifier`),
fairseq's score rules on torch tensors, and the acceptance rule called on them.
Runs wherever the model does (CPU or GPU)."""
import math
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ..acceptance import AcceptanceRule
from .base import PassResult, ScoreRules, Verifier
from .cached_decoder import CachedDecoderVerifier


def adjust_scores(logits: Tensor, positions: Tensor, max_len: int, rules: ScoreRules,
                  allowed: Optional[Tensor] = None):
    """fairseq's score rules (:class:`ScoreRules`) on ``logits`` (B, T, V) of
    rows that predict output steps ``positions`` (B, T); ``allowed`` (B, V):
    each row's shortlist.  Returns the adjusted scores to choose from and the
    log-normaliser (B, T, 1) of the unadjusted distribution."""
    logits = logits.float()
    if rules.temperature != 1.0:
        logits = logits / rules.temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed.unsqueeze(1), -math.inf)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    logits[..., rules.pad] = -math.inf
    if rules.unk_penalty:
        logits[..., rules.unk] -= rules.unk_penalty
    first = None
    if rules.forced is not None:  # fairseq's prefix token: its score after pad and unk, at output position 0
        first = (positions == 0) & (positions < max_len)
        forced_col = logits[..., rules.forced].clone()
    at_max = positions >= max_len
    if bool(at_max.any()):
        eos_col = logits[..., rules.eos].clone()
        logits[at_max] = -math.inf
        logits[..., rules.eos] = eos_col
    if rules.min_len > 0:
        logits[..., rules.eos] = logits[..., rules.eos].masked_fill(positions < rules.min_len, -math.inf)
    if first is not None and bool(first.any()):
        logits[first] = -math.inf
        logits[..., rules.forced] = torch.where(first, forced_col, logits[..., rules.forced])
    return logits, lse


class TorchVerifier(Verifier):
    """:class:`~fairseq_aggressive.verifiers.base.Verifier` on the model's own modules."""

    name = "torch"

    def __init__(self, model, rules: ScoreRules, acceptance: AcceptanceRule, shortlist=None):
        self.decoder = CachedDecoderVerifier(model)
        self.rules, self.acceptance, self.shortlist = rules, acceptance, shortlist
        # positions projected to the vocabulary before checking (the rule may need more at once)
        self.first_chunk = max(8, acceptance.first_chunk_min)
        self.state = None
        self._encoder_out = None
        self._allowed = None  # (B, V) of the batch's sentences still decoded, or None
        self._sents: List[int] = []  # the sentences the cache rows hold, in order

    def begin(self, sample, max_len: int, tree_room: int = 0) -> None:
        net_input = sample["net_input"]
        self._encoder_out = self.decoder.encode(net_input)
        self.state = self.decoder.begin(self._encoder_out, max_len + 1)
        self.max_len = max_len
        src_tokens = net_input["src_tokens"]
        self._allowed = None if self.shortlist is None else self.shortlist.allowed(src_tokens)
        self._sents = list(range(src_tokens.size(0)))

    def encoder_out(self):
        return self._encoder_out

    def _keep(self, sents: Sequence[int]) -> None:
        """Drop the cache rows of sentences that finished (they stop costing compute)."""
        if list(sents) == self._sents:
            return
        where = {s: i for i, s in enumerate(self._sents)}
        idx = torch.tensor([where[s] for s in sents], dtype=torch.long, device=self.state.lengths.device)
        self.state.select(idx)
        if self._allowed is not None:
            self._allowed = self._allowed.index_select(0, idx.to(self._allowed.device))
        self._sents = list(sents)

    def _choose(self, feats: Tensor, tokens: Tensor, n_draft: Tensor, positions: Tensor):
        """Choose tokens position chunk by position chunk (8, 16, 32, ...) and
        stop once every row has met its first rejection: the vocabulary
        projection of positions after it is never computed.  Returns the
        choices and log-probs of the positions computed and ``n_match``."""
        B, T = tokens.shape
        draft = torch.cat([tokens[:, 1:], tokens.new_full((B, 1), self.rules.pad)], dim=1)
        choices, scores = [], []
        n_match = torch.zeros_like(n_draft)
        lo, size = 0, self.first_chunk
        while lo < T:
            hi = min(T, lo + size)
            logits = self.decoder.output_layer(feats[:, lo:hi])
            adjusted, lse = adjust_scores(logits, positions[:, lo:hi], self.max_len, self.rules, self._allowed)
            n_valid = (n_draft - lo).clamp(min=0)
            choice, m = self.acceptance(adjusted, draft[:, lo:hi], n_valid, lo)
            choices.append(choice)
            scores.append(adjusted.gather(2, choice.unsqueeze(2)).squeeze(2) - lse.squeeze(2))
            n_match = torch.where(n_match == lo, n_match + m, n_match)
            if hi == T or not bool((n_match == hi).any()):
                break
            lo, size = hi, size * 2
        return torch.cat(choices, dim=1), torch.cat(scores, dim=1), n_match

    def step(self, sents, rows, branches=None, emitted_features=False, pass_features=False) -> PassResult:
        if branches is not None and any(len(b) > 1 for b in branches):
            raise ValueError("the torch verifier takes one draft per row")
        self._keep(sents)
        state = self.state
        device = state.lengths.device
        width = max(len(r) for r in rows)
        tokens = torch.tensor([r + [self.rules.pad] * (width - len(r)) for r in rows], dtype=torch.long,
                              device=device)  # (B, W)
        n_draft = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long, device=device)  # (B,)
        feats = self.decoder.forward(state, tokens, n_draft + 1)  # (B, W, C)
        positions = state.lengths.unsqueeze(1) + torch.arange(width, device=device)  # (B, W)
        choice, tok_scores, n_match = self._choose(feats, tokens, n_draft, positions)
        n_emit = n_match + 1
        steps = torch.arange(choice.size(1), device=device).unsqueeze(0)
        is_eos = (choice == self.rules.eos) & (steps < n_emit.unsqueeze(1))
        done = is_eos.any(dim=1)
        n_emit = torch.where(done, is_eos.long().argmax(dim=1) + 1, n_emit)  # (B,)
        self.decoder.commit(state, n_emit)
        emitted = None
        if emitted_features:
            emitted = feats[torch.arange(width, device=device).unsqueeze(0) < n_emit.unsqueeze(1)]
        choice_l, score_l, n_emit_l = choice.tolist(), tok_scores.tolist(), n_emit.tolist()
        return PassResult(
            emit=[c[:k] for c, k in zip(choice_l, n_emit_l)],
            scores=[s[:k] for s, k in zip(score_l, n_emit_l)],
            n_match=n_match.tolist(), done=done.tolist(), kept=[0] * len(rows),
            emitted_features=emitted, pass_features=feats if pass_features else None,
        )
