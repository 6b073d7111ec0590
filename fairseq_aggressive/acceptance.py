"""Acceptance rules: given the verifier's scores at some positions and the
drafted tokens there, decide which drafted tokens pass.

A rule is called with ``scores`` (B, W, V), ``draft`` (B, W) and ``n_valid``
(B,): position ``t`` predicts the token after ``draft[:, t-1]`` and is checked
against ``draft[:, t]`` where ``t < n_valid``.  It returns ``(choice,
n_match)``: ``choice[b, t]`` is the token emitted at position ``t`` if it is
reached, ``n_match[b]`` how many leading valid draft tokens pass.  The
generator emits the accepted draft tokens plus the verifier's own choice at the
first rejected position (the bifurcation), so every pass makes progress.
"""
from typing import Tuple

import torch
from torch import Tensor


def leading_true(mask: Tensor) -> Tensor:
    """Length of the all-True prefix of each row of a (B, N) bool tensor."""
    if mask.size(1) == 0:
        return mask.new_zeros(mask.size(0), dtype=torch.long)
    return mask.long().cumprod(dim=1).sum(dim=1)


def valid_mask(n_valid: Tensor, width: int) -> Tensor:
    """(B, width) bool: which slots hold a real drafted token."""
    return torch.arange(width, device=n_valid.device).unsqueeze(0) < n_valid.unsqueeze(1)


class ExactAcceptance:
    """Accept a drafted token iff it is the verifier's top-1 (greedy) choice.
    Output is token-for-token that of greedy decoding."""

    exact_greedy = True  # capability: the native engine implements this rule

    def __call__(self, scores: Tensor, draft: Tensor, n_valid: Tensor) -> Tuple[Tensor, Tensor]:
        choice = scores.argmax(dim=-1)
        ok = (choice == draft) & valid_mask(n_valid, draft.size(1))
        return choice, leading_true(ok)


class TopBetaTauAcceptance:
    """GAD++ (Xia et al. 2023, Eq. 8-9): accept a drafted token if it is among
    the verifier's top-``beta`` and its log-probability is within ``tau`` of the
    top-1's.  Ties with the ``beta``-th score count as inside the top-``beta``
    (rank = number of strictly better tokens).  ``beta == 1`` is exact
    acceptance.  Accepted positions emit the drafted token, the bifurcation
    emits the verifier's top-1."""

    def __init__(self, beta: int, tau: float):
        if int(beta) != beta or beta < 1:
            raise ValueError(f"--gad-beta must be an integer >= 1, got {beta}")
        if not tau >= 0 or tau == float("inf"):
            raise ValueError(f"--gad-tau must be a finite number >= 0, got {tau}")
        self.beta, self.tau = int(beta), float(tau)

    def __call__(self, scores: Tensor, draft: Tensor, n_valid: Tensor) -> Tuple[Tensor, Tensor]:
        top1, best = scores.max(dim=-1)
        d = draft.clamp(min=0, max=scores.size(-1) - 1)
        d_score = scores.gather(-1, d.unsqueeze(-1)).squeeze(-1)
        rank = (scores > d_score.unsqueeze(-1)).sum(-1)
        ok = (
            valid_mask(n_valid, draft.size(1))
            & torch.isfinite(d_score)
            & (rank < self.beta)
            & (d_score >= top1 - self.tau)
        )
        n_match = leading_true(ok)
        steps = torch.arange(draft.size(1), device=draft.device).unsqueeze(0)
        choice = torch.where(steps < n_match.unsqueeze(1), d, best)
        return choice, n_match


def build_acceptance(beta: int = 1, tau: float = 0.0):
    """Exact acceptance for ``beta == 1``, GAD++ otherwise (arguments checked)."""
    rule = TopBetaTauAcceptance(beta, tau)
    return ExactAcceptance() if rule.beta == 1 else rule


class TopKAcceptance(TopBetaTauAcceptance):
    """Blockwise parallel decoding's approximate rule (Stern et al. 2018,
    sec. 5.2): accept a drafted token that is among the verifier's top-K."""

    def __init__(self, topk: int):
        if int(topk) != topk or topk < 1:
            raise ValueError(f"--blockwise-topk must be an integer >= 1, got {topk}")
        self.beta, self.tau = int(topk), float("inf")


class MinBlockAcceptance:
    """Wraps a rule so every pass emits at least ``min_block`` tokens (when that
    many are drafted): the first ``min_block - 1`` drafted tokens pass whatever
    the verifier says, the verifier adds one (Stern et al. 2018, sec. 5.3).
    Tokens the length rules forbid (e.g. anything but EOS at the maximum
    length) are never forced."""

    uses_offset = True  # called chunk by chunk with the chunk's first position

    def __init__(self, rule, min_block: int, block_size: int = None):
        if int(min_block) != min_block or min_block < 1:
            raise ValueError(f"--min-block-size must be an integer >= 1, got {min_block}")
        if block_size is not None and min_block > block_size:
            raise ValueError(f"--min-block-size {min_block} is larger than the block size k={block_size}")
        self.rule, self.forced = rule, int(min_block) - 1

    def __call__(self, scores: Tensor, draft: Tensor, n_valid: Tensor, offset: int = 0) -> Tuple[Tensor, Tensor]:
        choice, n_match = self.rule(scores, draft, n_valid)
        n_forced = self.forced - offset  # the generator checks positions in chunks
        if n_forced <= 0:
            return choice, n_match
        d = draft.clamp(min=0, max=scores.size(-1) - 1)
        allowed = torch.isfinite(scores.gather(-1, d.unsqueeze(-1)).squeeze(-1))  # never forced past max_len
        steps = torch.arange(draft.size(1), device=draft.device).unsqueeze(0)
        forced = leading_true(allowed & (steps < n_valid.clamp(max=n_forced).unsqueeze(1)))
        choice = torch.where(steps < forced.unsqueeze(1), d, choice)
        return choice, torch.maximum(n_match, forced)


def build_blockwise_acceptance(topk: int = 1, min_block: int = 1, block_size: int = None):
    """Exact, top-K and/or minimum-block-size acceptance for blockwise decoding."""
    rule = TopKAcceptance(topk)
    rule = ExactAcceptance() if rule.beta == 1 else rule
    wrapped = MinBlockAcceptance(rule, min_block, block_size)
    return rule if wrapped.forced == 0 else wrapped
