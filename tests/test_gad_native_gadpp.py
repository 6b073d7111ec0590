"""GAD++ (top-beta/tau acceptance, Ge et al. 2022) in the native engine: on
the same drafts, the native verifier emits what the torch verifier's
TopBetaTauAcceptance emits (tokens, scores, accepted counts), with fairseq's
adjustments (length limits, unk penalty, temperature) and on a vocabulary
shortlist; and the rule does accept tokens greedy would not have chosen (so
these comparisons can fail)."""
import pytest
import torch

from fairseq_aggressive.acceptance import ExactAcceptance, TopBetaTauAcceptance
from fairseq_aggressive.drafters import NARBlockDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.shortlist import VocabShortlist
from helpers import fast_first, greedy, make_model, make_sample, make_task, needs_native, random_rows
from test_gad import GreedyOracleBlockModel


RULES = [(2, 0.5), (3, 2.0), (5, 6.0), (40, 100.0)]
OPTIONS = [
    dict(max_len_b=40),
    dict(max_len_a=1.0, max_len_b=2, min_len=3),  # EOS forced at max_len, forbidden before min_len
    dict(max_len_b=40, unk_penalty=0.7, temperature=1.3),
]


def decode(ar, task, drafter_model, k, samples, engine, rule, **kw):
    """Hypotheses of every sample and the generator; the drafter stays in torch
    (GAD++'s output depends on the drafts: both verifiers must see the same)."""
    d = task.target_dictionary
    gen = build_generator([ar], d, NARBlockDrafter(drafter_model, d, k, engine="torch"), acceptance=rule,
                              engine=engine, **kw)
    assert (gen.native is not None) == (engine == "native")
    return [h for s in samples for h in gen.generate([ar], s)], gen


def assert_same(a, b, gen_a, gen_b):
    for x, y in zip(a, b):
        assert x[0]["tokens"].tolist() == y[0]["tokens"].tolist()
        assert torch.allclose(x[0]["positional_scores"], y[0]["positional_scores"], atol=1e-4)
    sa, sb = gen_a.stats, gen_b.stats
    assert (sa.passes, sa.drafted, sa.accepted) == (sb.passes, sb.drafted, sb.accepted)


@needs_native
@pytest.mark.parametrize("ri", fast_first(list(range(len(RULES)))))
@pytest.mark.parametrize("oi", fast_first(list(range(len(OPTIONS)))))
def test_native_gadpp_equals_torch_gadpp(ri, oi):
    """A random drafter and the verifier's own greedy continuation with every
    third token corrupted (long runs that GAD++ may extend past a wrong token),
    batch 1 and 6."""
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=30 + ri, decoder_layers=3, decoder_normalize_before=True)
    dr = make_model(task, arch="block_nat", seed=40 + ri, decoder_layers=1)
    rule = TopBetaTauAcceptance(*RULES[ri])
    accepted, memo = {}, {}
    for name, drafter in (("random", lambda: dr), ("oracle", lambda: GreedyOracleBlockModel(ar, d, 3, memo))):
        for bsz, k in ((1, 4), (6, 8)):
            samples = [make_sample(random_rows(d, bsz, 2, 30, seed=100 * oi + 10 * ri + rep + bsz), d.pad())
                       for rep in range(2)]
            ref, g_torch = decode(ar, task, drafter(), k, samples, "torch", rule, **OPTIONS[oi])
            out, g_native = decode(ar, task, drafter(), k, samples, "native", rule, **OPTIONS[oi])
            assert_same(ref, out, g_torch, g_native)
            accepted[name] = accepted.get(name, 0) + g_native.stats.accepted
    assert accepted["oracle"] > 0, accepted


@needs_native
def test_native_gadpp_accepts_what_greedy_would_not_choose():
    """A loose rule emits non-greedy tokens on the native engine (a tight one
    accepts less), so the comparisons above compare something GAD++ decides."""
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=5)
    dr = make_model(task, arch="block_nat", seed=6, decoder_layers=1)
    samples = [make_sample(random_rows(d, 6, 5, 30, seed=s), d.pad()) for s in range(3)]
    ref = [h for s in samples for h in greedy(ar, d, s, max_len_b=40)]
    exact, g_exact = decode(ar, task, dr, 8, samples, "native", ExactAcceptance(), max_len_b=40)
    loose, g_loose = decode(ar, task, dr, 8, samples, "native", TopBetaTauAcceptance(40, 100.0), max_len_b=40)
    assert [h[0]["tokens"].tolist() for h in exact] == [h[0]["tokens"].tolist() for h in ref]
    differ = sum(a[0]["tokens"].tolist() != b[0]["tokens"].tolist() for a, b in zip(loose, ref))
    assert differ > len(ref) // 2, differ
    assert g_loose.stats.accepted > 2 * g_exact.stats.accepted


@needs_native
def test_native_gadpp_on_a_shortlist_equals_torch():
    """With --vocab-shortlist, a drafted token outside a sentence's shortlist
    never passes, and both verifiers rank within the same shortlist."""
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=11)
    dr = make_model(task, arch="block_nat", seed=12, decoder_layers=1)
    sl = VocabShortlist(d, d, 8)
    rule = TopBetaTauAcceptance(5, 6.0)
    for bsz in (1, 6):
        samples = [make_sample(random_rows(d, bsz, 3, 25, seed=50 + bsz + rep), d.pad()) for rep in range(3)]
        ref, g_torch = decode(ar, task, dr, 6, samples, "torch", rule, max_len_b=30, shortlist=sl)
        out, g_native = decode(ar, task, dr, 6, samples, "native", rule, max_len_b=30, shortlist=sl)
        assert_same(ref, out, g_torch, g_native)
        for i, h in enumerate(out):  # every emitted token is in its sentence's shortlist
            s = samples[i // bsz]["net_input"]["src_tokens"][i % bsz : i % bsz + 1]
            assert sl.allowed(s)[0, h[0]["tokens"]].all()
        assert g_native.stats.accepted > 0
