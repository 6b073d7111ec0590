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

    def __call__(self, scores: Tensor, draft: Tensor, n_valid: Tensor) -> Tuple[Tensor, Tensor]:
        choice = scores.argmax(dim=-1)
        ok = (choice == draft) & valid_mask(n_valid, draft.size(1))
        return choice, leading_true(ok)
