"""Acceptance rules: given the verifier's scores at some positions and the
drafted tokens there, decide which drafted tokens pass.

Every rule is an :class:`AcceptanceRule` with one call signature:
``rule(scores, draft, n_valid, offset)``.  ``scores`` (B, W, V) are the
verifier's adjusted scores at W consecutive draft slots, ``draft`` (B, W) the
drafted tokens there, ``n_valid`` (B,) how many of the W slots hold a real
drafted token, and ``offset`` the index of the first of the W slots within the
pass's draft (the generator checks a long draft chunk by chunk: 0, 8, 24, ...).
Slot ``t`` predicts the token after ``draft[:, t-1]`` and is checked against
``draft[:, t]``.  A rule returns ``(choice, n_match)``: ``choice[b, t]`` is the
token emitted at slot ``t`` if it is reached, ``n_match[b]`` how many leading
valid draft tokens pass.  The generator emits the accepted draft tokens plus
the verifier's own choice at the first rejected slot (the bifurcation), so
every pass makes progress.

Every rule describes itself with :class:`AcceptanceParams` (``rule.params``):
top-``beta`` within ``tau`` of the top-1's log-probability (``beta`` 1: greedy's
own choice) and ``min_block`` (the first ``min_block - 1`` drafted tokens pass
whatever the verifier says).  The torch verifier applies a rule by calling it
(:func:`apply_params` implements the description); the native engine applies
the same description itself (:attr:`AcceptanceParams.native`).  Rules also say
``exact_greedy`` (the output is greedy decoding's) and ``first_chunk_min``
(the first call must cover at least that many slots; a later chunk is only
used for rows whose every earlier slot passed).
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .options import check_positive_int


def leading_true(mask: Tensor) -> Tensor:
    """Length of the all-True prefix of each row of a (B, N) bool tensor."""
    if mask.size(1) == 0:
        return mask.new_zeros(mask.size(0), dtype=torch.long)
    return mask.long().cumprod(dim=1).sum(dim=1)


def valid_mask(n_valid: Tensor, width: int) -> Tensor:
    """(B, width) bool: which slots hold a real drafted token."""
    return torch.arange(width, device=n_valid.device).unsqueeze(0) < n_valid.unsqueeze(1)


@dataclass(frozen=True)
class AcceptanceParams:
    """What a rule accepts, the one description both engines apply: a drafted
    token passes if it is among the verifier's top-``beta`` (ties with the
    ``beta``-th score inside) and within ``tau`` of the top-1's log-probability;
    ``beta`` 1 is greedy's own choice (the first of tied maxima, as argmax).
    The first ``min_block - 1`` drafted tokens pass whatever the verifier says
    (never a token the length rules forbid)."""

    beta: int = 1
    tau: float = 0.0
    min_block: int = 1

    @property
    def exact_greedy(self) -> bool:
        return self.beta == 1 and self.min_block == 1

    @property
    def native(self) -> Optional[Tuple[int, float]]:
        """``(beta, tau)`` for the native engine's rule, or None where it cannot apply it."""
        return (self.beta, self.tau) if self.min_block == 1 else None


def apply_params(p: AcceptanceParams, scores: Tensor, draft: Tensor, n_valid: Tensor,
                 offset: int = 0) -> Tuple[Tensor, Tensor]:
    """``rule(scores, draft, n_valid, offset)`` for the rule ``p`` describes."""
    if p.beta == 1:
        choice = scores.argmax(dim=-1)
        n_match = leading_true((choice == draft) & valid_mask(n_valid, draft.size(1)))
    else:
        choice, n_match = _rank(p.beta, p.tau, scores, draft, n_valid)
    n_forced = p.min_block - 1 - offset  # slots before ``offset`` were checked in earlier chunks
    if n_forced <= 0:
        return choice, n_match
    d = draft.clamp(min=0, max=scores.size(-1) - 1)
    allowed = torch.isfinite(scores.gather(-1, d.unsqueeze(-1)).squeeze(-1))  # never forced past max_len
    steps = torch.arange(draft.size(1), device=draft.device).unsqueeze(0)
    forced = leading_true(allowed & (steps < n_valid.clamp(max=n_forced).unsqueeze(1)))
    choice = torch.where(steps < forced.unsqueeze(1), d, choice)
    return choice, torch.maximum(n_match, forced)


def _rank(beta: int, tau: float, scores: Tensor, draft: Tensor, n_valid: Tensor) -> Tuple[Tensor, Tensor]:
    """Top-``beta`` within ``tau``: rank = number of strictly better tokens;
    accepted slots emit the drafted token, the bifurcation the top-1."""
    top1, best = scores.max(dim=-1)
    d = draft.clamp(min=0, max=scores.size(-1) - 1)
    d_score = scores.gather(-1, d.unsqueeze(-1)).squeeze(-1)
    rank = (scores > d_score.unsqueeze(-1)).sum(-1)
    ok = valid_mask(n_valid, draft.size(1)) & torch.isfinite(d_score) & (rank < beta) & (d_score >= top1 - tau)
    n_match = leading_true(ok)
    steps = torch.arange(draft.size(1), device=draft.device).unsqueeze(0)
    return torch.where(steps < n_match.unsqueeze(1), d, best), n_match


class AcceptanceRule:
    """The contract of every rule (see the module docstring): ``params``
    describes it, calling it applies that description to torch tensors."""

    params = AcceptanceParams()

    @property
    def exact_greedy(self) -> bool:
        return self.params.exact_greedy

    @property
    def first_chunk_min(self) -> int:
        """Slots the first call of a pass must cover: the forced ones and the one after them."""
        return self.params.min_block

    def __call__(self, scores: Tensor, draft: Tensor, n_valid: Tensor, offset: int = 0) -> Tuple[Tensor, Tensor]:
        return apply_params(self.params, scores, draft, n_valid, offset)

    def __repr__(self) -> str:
        p = self.params
        return f"{type(self).__name__}(beta={p.beta}, tau={p.tau}, min_block={p.min_block})"


class ExactAcceptance(AcceptanceRule):
    """Accept a drafted token iff it is the verifier's top-1 (greedy) choice.
    Output is token-for-token that of greedy decoding."""


class RankAcceptance(AcceptanceRule):
    """Accept a drafted token if it is among the verifier's top-``beta`` and
    its log-probability is within ``tau`` of the top-1's.  Ties with the
    ``beta``-th score count as inside the top-``beta``.  Accepted slots emit the
    drafted token, the bifurcation emits the verifier's top-1.  Arguments are
    not checked: build the rules below."""

    def __init__(self, beta: int, tau: float):
        self.params = AcceptanceParams(beta, tau)

    @property
    def beta(self) -> int:
        return self.params.beta

    @property
    def tau(self) -> float:
        return self.params.tau


class TopBetaTauAcceptance(RankAcceptance):
    """GAD++ (Ge et al. 2022, Eq. 8-9): top-``beta`` within ``tau`` of the
    top-1's log-probability.  ``beta == 1`` is exact acceptance."""

    def __init__(self, beta: int, tau: float):
        if not tau >= 0 or tau == math.inf:
            raise ValueError(f"--gad-tau must be a finite number >= 0, got {tau}")
        super().__init__(check_positive_int(beta, "--gad-beta"), float(tau))


class TopKAcceptance(RankAcceptance):
    """Blockwise parallel decoding's approximate rule (Stern et al. 2018,
    sec. 5.1): accept a drafted token that is among the verifier's top-K."""

    def __init__(self, topk: int):
        super().__init__(check_positive_int(topk, "--blockwise-topk"), math.inf)


def build_acceptance(beta: int = 1, tau: float = 0.0) -> AcceptanceRule:
    """Exact acceptance for ``beta == 1``, GAD++ otherwise (arguments checked)."""
    rule = TopBetaTauAcceptance(beta, tau)
    return ExactAcceptance() if rule.beta == 1 else rule


class MinBlockAcceptance(AcceptanceRule):
    """Wraps a rule so every pass emits at least ``min_block`` tokens (when that
    many are drafted): the first ``min_block - 1`` drafted tokens pass whatever
    the verifier says, the verifier adds one (Stern et al. 2018, sec. 5.3).
    Tokens the length rules forbid (e.g. anything but EOS at the maximum
    length) are never forced."""

    def __init__(self, rule: AcceptanceRule, min_block: int, block_size: int = None):
        min_block = check_positive_int(min_block, "--min-block-size")
        if block_size is not None and min_block > block_size:
            raise ValueError(f"--min-block-size {min_block} is larger than the block size k={block_size}")
        self.rule, self.forced = rule, min_block - 1
        p = rule.params
        self.params = AcceptanceParams(p.beta, p.tau, max(p.min_block, min_block))


def build_blockwise_acceptance(topk: int = 1, min_block: int = 1, block_size: int = None) -> AcceptanceRule:
    """Exact, top-K and/or minimum-block-size acceptance for blockwise decoding."""
    rule = TopKAcceptance(topk)
    rule = ExactAcceptance() if rule.beta == 1 else rule
    wrapped = MinBlockAcceptance(rule, min_block, block_size)
    return rule if wrapped.forced == 0 else wrapped
