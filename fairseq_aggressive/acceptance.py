"""Acceptance rules: given the verifier's scores over ``[last, d_1..d_n]``
decide how many drafted tokens to keep.

A rule returns ``(choice, n_match)``: ``choice[b, t]`` is the token emitted at
position ``t`` if it is reached, ``n_match[b]`` how many leading draft tokens
pass.  The generator then emits ``choice[b, :n_match+1]``: the accepted draft
tokens plus the verifier's own token at the first rejected position (the
bifurcation), so every pass makes progress.
"""
from typing import Tuple

import torch
from torch import Tensor


def leading_true(mask: Tensor) -> Tensor:
    """Length of the all-True prefix of each row of a (B, N) bool tensor."""
    if mask.size(1) == 0:
        return mask.new_zeros(mask.size(0), dtype=torch.long)
    return mask.long().cumprod(dim=1).sum(dim=1)


def draft_mask(n_draft: Tensor, width: int) -> Tensor:
    """(B, width) bool: which draft slots hold a real drafted token."""
    return torch.arange(width, device=n_draft.device).unsqueeze(0) < n_draft.unsqueeze(1)


class ExactAcceptance:
    """Accept a drafted token iff it is the verifier's top-1 (greedy) choice.
    Output is token-for-token that of greedy decoding."""

    def __call__(self, scores: Tensor, draft: Tensor, n_draft: Tensor) -> Tuple[Tensor, Tensor]:
        """``scores``: (B, T, V) adjusted log-probs (or logits) of the verifier,
        ``draft``: (B, T-1) drafted tokens, ``n_draft``: (B,) real draft lengths."""
        choice = scores.argmax(dim=-1)
        ok = (choice[:, :-1] == draft) & draft_mask(n_draft, draft.size(1))
        return choice, leading_true(ok)
