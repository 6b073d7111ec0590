"""Acceptance rules on crafted scores: the GAD++ top-beta/tau rule, blockwise
top-K and minimum block, argument checks, and the contract every rule keeps
(one call signature; a draft checked chunk by chunk, as the generator does,
decides as the whole draft does)."""
import math

import pytest
import torch

from helpers import crafted, make_model, make_task
from fairseq_aggressive.acceptance import (
    AcceptanceParams,
    AcceptanceRule,
    ExactAcceptance,
    MinBlockAcceptance,
    TopBetaTauAcceptance,
    TopKAcceptance,
    build_acceptance,
    build_blockwise_acceptance,
)
from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator


def test_top_beta_tau_rule_on_crafted_scores():
    # vocabulary of 5; position 0: token 3 is 2nd best, close to top-1 (token 1)
    # position 1: token 4 is 2nd best but far from the top-1 (token 0)
    # position 2: token 2 is 3rd best and close
    scores = crafted([[0.0, 2.0, 0.5, 1.9, 0.1],
                      [9.0, 0.0, 0.0, 0.0, 3.0],
                      [0.0, 1.0, 0.8, 0.9, 0.0]])
    draft = torch.tensor([[3, 4, 2]])
    n = torch.tensor([3])
    choice, m = TopBetaTauAcceptance(2, 0.5)(scores, draft, n)
    assert m.tolist() == [1]  # pos 0 passes (top-2, gap 0.1), pos 1 fails (gap 6 > tau)
    assert choice[0, 0].item() == 3 and choice[0, 1].item() == 0  # draft, then top-1
    choice, m = TopBetaTauAcceptance(2, 10.0)(scores, draft, n)
    assert m.tolist() == [2]  # pos 1 now within tau; pos 2 is 3rd: outside top-2
    assert choice[0, 2].item() == 1
    choice, m = TopBetaTauAcceptance(3, 10.0)(scores, draft, n)
    assert m.tolist() == [3]
    assert ExactAcceptance()(scores, draft, n)[1].tolist() == [0]
    # invalid (padding) slots never pass; -inf scores never pass
    assert TopBetaTauAcceptance(5, 100.0)(scores, draft, torch.tensor([1]))[1].tolist() == [1]
    masked = scores.clone()
    masked[0, 0, 3] = -float("inf")
    assert TopBetaTauAcceptance(5, float(1e9))(masked, draft, n)[1].tolist() == [0]


@pytest.mark.parametrize("beta,tau", [(0, 1.0), (-1, 1.0), (1.5, 1.0), (2, -0.1), (2, float("nan")),
                                      (2, float("inf"))])
def test_bad_beta_tau(beta, tau):
    with pytest.raises(ValueError, match="--gad-"):
        build_acceptance(beta, tau)


def test_build_acceptance_exact_for_beta1():
    assert isinstance(build_acceptance(1, 3.0), ExactAcceptance)
    assert isinstance(build_acceptance(3, 1.0), TopBetaTauAcceptance)


def test_topk_and_min_block_rules():
    scores = crafted([[0.0, 2.0, 0.5, 1.9, 0.1],
                      [9.0, 0.0, 0.0, 0.0, 3.0],
                      [0.0, 1.0, 0.8, 0.9, 0.0],
                      [0.0, 1.0, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[3, 4, 2, 0]])
    n = torch.tensor([4])
    assert ExactAcceptance()(scores, draft, n)[1].tolist() == [0]
    assert TopKAcceptance(2)(scores, draft, n)[1].tolist() == [2]  # 3 2nd, 4 2nd, 2 3rd
    assert TopKAcceptance(3)(scores, draft, n)[1].tolist() == [4]  # 0 is tied 2nd (1 better)
    # min block 3: the first 2 drafted tokens pass whatever the verifier says
    choice, m = MinBlockAcceptance(ExactAcceptance(), 3)(scores, draft, n)
    assert m.tolist() == [2] and choice[0, :2].tolist() == [3, 4] and choice[0, 2].item() == 1
    # fewer drafted tokens than the minimum: only those pass
    assert MinBlockAcceptance(ExactAcceptance(), 4)(scores, draft, torch.tensor([1]))[1].tolist() == [1]
    # offsets: positions before the chunk already counted
    assert MinBlockAcceptance(ExactAcceptance(), 3)(scores, draft, n, offset=2)[1].tolist() == [0]
    # a token the length rules forbid (-inf) is never forced
    masked = scores.clone()
    masked[0, 1, 4] = -float("inf")
    assert MinBlockAcceptance(ExactAcceptance(), 4)(masked, draft, n)[1].tolist() == [1]
    # min block composes with top-k
    assert MinBlockAcceptance(TopKAcceptance(2), 2)(scores, draft, n)[1].tolist() == [2]


RULES = [
    ExactAcceptance(),
    TopBetaTauAcceptance(2, 0.5),
    TopBetaTauAcceptance(3, 4.0),
    TopKAcceptance(2),
    MinBlockAcceptance(ExactAcceptance(), 3),
    MinBlockAcceptance(TopKAcceptance(3), 6),
    MinBlockAcceptance(ExactAcceptance(), 12),  # more forced slots than the generator's first chunk
    build_blockwise_acceptance(2, 4),
]


@pytest.mark.parametrize("ri", range(len(RULES)))
@pytest.mark.parametrize("seed", range(4))
def test_chunked_calls_decide_as_one_call(ri, seed):
    """The generator checks slots 0-7, 8-23, ... (the first chunk at least
    ``first_chunk_min``) and keeps a chunk's result only where every earlier
    slot passed: that must be what one call over the whole draft decides, for
    every rule (offset is the chunk's first slot)."""
    rule = RULES[ri]
    assert isinstance(rule, AcceptanceRule)
    g = torch.Generator().manual_seed(seed)
    B, W, V = 6, 20, 7
    scores = torch.randn(B, W, V, generator=g).mul(2).log_softmax(-1)
    # drafts that mostly agree with the top-1 so that long prefixes pass
    draft = scores.argmax(-1)
    flip = torch.rand(B, W, generator=g) < 0.15
    draft = torch.where(flip, torch.randint(0, V, (B, W), generator=g), draft)
    n_valid = torch.randint(W // 2, W + 1, (B,), generator=g)
    choice, n_match = rule(scores, draft, n_valid, 0)
    got_match = torch.zeros_like(n_match)
    got_choice = []
    first = max(3, rule.first_chunk_min)
    for lo, hi in [(0, first), (first, first + 6), (first + 6, W)]:
        c, m = rule(scores[:, lo:hi], draft[:, lo:hi], (n_valid - lo).clamp(min=0), lo)
        got_choice.append(c)
        got_match = torch.where(got_match == lo, got_match + m, got_match)
    assert got_match.tolist() == n_match.tolist()
    got_choice = torch.cat(got_choice, 1)
    for b in range(B):  # emitted: accepted slots plus the bifurcation
        k = min(int(n_match[b]) + 1, W)
        assert got_choice[b, :k].tolist() == choice[b, :k].tolist()
    assert 0 < int(n_match.sum()) < int(n_valid.sum())  # the rules decided something


def test_generator_takes_rules_only():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task)
    with pytest.raises(TypeError, match="AcceptanceRule"):
        build_generator([model], d, InputCopyDrafter(d, d), acceptance=lambda s, dr, n: None)
    assert ExactAcceptance().exact_greedy and ExactAcceptance().params == AcceptanceParams()
    assert not any(r.exact_greedy for r in RULES[1:])


def test_rules_describe_themselves():
    """Each rule's description is what it applies, and tells the native engine
    what it can run: rank rules yes, forced minimum blocks no."""
    assert TopBetaTauAcceptance(2, 0.5).params == AcceptanceParams(2, 0.5, 1)
    assert TopKAcceptance(3).params == AcceptanceParams(3, math.inf, 1)
    assert MinBlockAcceptance(TopKAcceptance(3), 6).params == AcceptanceParams(3, math.inf, 6)
    assert build_acceptance(1, 0.0).params.native == (1, 0.0)
    assert build_acceptance(3, 1.0).params.native == (3, 1.0)
    assert MinBlockAcceptance(ExactAcceptance(), 3).params.native is None
    assert MinBlockAcceptance(ExactAcceptance(), 3).first_chunk_min == 3
    assert "beta=2" in repr(TopBetaTauAcceptance(2, 0.5))
