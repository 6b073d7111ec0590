"""The vocabulary shortlist (--vocab-shortlist, approximate): aggressive
decoding on the shortlist equals fairseq's own greedy search on the same
shortlisted model (stock SequenceGenerator with the excluded logits masked),
on both verifiers; the native engine's IAD equals its greedy bit for bit; the
shortlist does change outputs of the full model (so these tests can fail)."""
import argparse
import copy
import math
import random

import pytest
import torch

from fairseq_aggressive.bench.modes import mode_overrides, reference_mode
from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.runtime.quantization import quantize_int8
from fairseq_aggressive.shortlist import VocabShortlist
from helpers import compare, greedy, make_dict, make_model, make_sample, make_task, needs_native
from test_equivalence import batches, random_sources

GEN = dict(max_len_a=0, max_len_b=30)
N_FREQUENT = 8  # of 40 symbols: most choices of a random model lie outside the shortlist


def fairseq_greedy_on_shortlist(model, d, rows, shortlist):
    """Stock SequenceGenerator greedy, one sentence at a time, on the model whose
    logits outside the sentence's shortlist are -inf (before log_softmax)."""
    out = []
    for row in rows:
        sample = make_sample([row], d.pad())
        allowed = shortlist.allowed(sample["net_input"]["src_tokens"])[0]
        original = model.get_normalized_probs

        def masked(net_output, log_probs, sample=None, original=original, allowed=allowed):
            logits = net_output[0].masked_fill(~allowed, -math.inf)
            return original((logits,) + tuple(net_output[1:]), log_probs, sample)

        model.get_normalized_probs = masked
        try:
            out += greedy(model, d, sample, **GEN)
        finally:
            del model.get_normalized_probs
    return out


def decode(model, d, rows, bsz, shortlist, engine, **kw):
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine=engine, shortlist=shortlist, **GEN, **kw)
    outs = []
    for chunk in batches(rows, bsz):
        outs += gen.generate([model], make_sample(chunk, d.pad()))
    return outs, gen


def _rows(seed, n=24):
    rng = random.Random(seed)
    return random_sources(rng, n, 40, 2) + random_sources(rng, n // 2, 40, 2, repeat=True)


def test_shortlist_ids():
    d = make_dict()
    sl = VocabShortlist(d, d, 5)
    assert sl.n_common == d.nspecial + 5
    src = make_sample([[30, 5, 30, 12, d.eos()], [7, d.eos()]], d.pad())["net_input"]["src_tokens"]
    assert sl.extras(src) == [[12, 30], []]
    allowed = sl.allowed(src)
    assert allowed.shape == (2, len(d))
    assert allowed[0].nonzero().flatten().tolist() == list(range(9)) + [12, 30]
    assert allowed[1].sum() == 9
    # separate dictionaries map by symbol; a symbol the target lacks maps to unk (common)
    tgt = make_dict(20)
    sl2 = VocabShortlist(d, tgt, 2)
    assert sl2.extras(src) == [[12], [7]]  # w26 (id 30) is not in tgt: unk
    assert VocabShortlist(d, d, 10_000).n_common == len(d)
    with pytest.raises(ValueError, match="--vocab-shortlist"):
        VocabShortlist(d, d, 0)


@pytest.mark.parametrize("engine", [pytest.param("native", marks=needs_native),
                                    pytest.param("torch", marks=pytest.mark.slow)])
def test_shortlist_aggressive_equals_fairseq_greedy_on_the_shortlist(engine):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=21)
    rows = _rows(1)
    sl = VocabShortlist(d, d, N_FREQUENT)
    ref = fairseq_greedy_on_shortlist(model, d, rows, sl)
    # (the whole vocabulary's outputs only count the changes: batches of 8, the same fixed length limit)
    full = [h for chunk in batches(rows, 8) for h in greedy(model, d, make_sample(chunk, d.pad()), **GEN)]
    changed = sum(a[0]["tokens"].tolist() != b[0]["tokens"].tolist() for a, b in zip(ref, full))
    assert changed > len(rows) // 4, changed  # the shortlist changes the model's outputs
    src = make_sample(rows, d.pad())["net_input"]["src_tokens"]
    allowed = sl.allowed(src)
    for i, h in enumerate(ref):  # only shortlisted tokens
        assert allowed[i, h[0]["tokens"]].all()
    for bsz in (1, 8):
        # (drafts as made: the tiny model's passes are too cheap for the draft-length policy to draft)
        for kw in (dict(), dict(draft_cost="off"), dict(max_draft_len=0), dict(max_draft_len=3, draft_cost="off")):
            out, gen = decode(model, d, rows, bsz, sl, engine, **kw)
            assert (gen.native is not None) == (engine == "native")
            for r, o in zip(ref, out):
                assert r[0]["tokens"].tolist() == o[0]["tokens"].tolist()
                assert torch.allclose(r[0]["positional_scores"], o[0]["positional_scores"], atol=1e-4)
            if kw.get("draft_cost") == "off":
                assert gen.stats.accepted > 0


@needs_native
@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_native_shortlist_iad_is_bit_identical_to_its_greedy(int8):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=4, encoder_normalize_before=True, decoder_normalize_before=True)
    if int8:
        model = quantize_int8(copy.deepcopy(model)).eval()
    rows = _rows(2)
    sl = VocabShortlist(d, d, N_FREQUENT)
    ref, g0 = decode(model, d, rows, 1, sl, "native", max_draft_len=0)
    assert g0.native is not None and g0.stats.drafted == 0
    full, _ = decode(model, d, rows, 1, None, "native", max_draft_len=0)
    assert any(a[0]["tokens"].tolist() != b[0]["tokens"].tolist() for a, b in zip(ref, full))
    for bsz, lmax, cost in ((1, None, "off"), (8, 1024, "off"), (8, 2, "off"), (8, None, None)):
        out, gen = decode(model, d, rows, bsz, sl, "native", max_draft_len=lmax, draft_cost=cost)
        assert gen.stats.accepted > 0 or cost is None  # (drafts as made; the policy's are checked for output)
        for x, y in zip(ref, out):
            assert x[0]["tokens"].tolist() == y[0]["tokens"].tolist()
            assert x[0]["positional_scores"].tolist() == y[0]["positional_scores"].tolist()


@needs_native
def test_native_shortlist_tokens_match_torch_verifier_with_float16_weights():
    """Weights stored as float16 (the shipped model's case) gather like float32 ones."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=8)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    rows = _rows(3)
    sl = VocabShortlist(d, d, N_FREQUENT)
    ref, _ = decode(model, d, rows, 1, sl, "torch", max_draft_len=0)
    out, gen = decode(model, d, rows, 8, sl, "native")
    assert gen.native.half_linears > 0
    cmp = compare(model, make_sample(rows, d.pad()), ref, out)
    assert cmp.identical == len(rows), cmp


def test_shortlist_option_errors():
    with pytest.raises(ValueError, match="--vocab-shortlist needs an aggressive --decoding"):
        make_task(vocab_shortlist=100)
    with pytest.raises(ValueError, match="--vocab-shortlist must be an integer >= 1"):
        make_task(decoding="iad", vocab_shortlist=0)
    task = make_task()
    args = argparse.Namespace(beam=1, vocab_shortlist=50)
    with pytest.raises(ValueError, match="--vocab-shortlist needs an aggressive"):
        task.build_generator([make_model(task)], args)
    gen = task.build_generator([make_model(task)], argparse.Namespace(beam=1, decoding="iad", vocab_shortlist=50))
    assert gen.verifier.shortlist is not None and gen.verifier.shortlist.n_common == len(task.target_dictionary)


def test_bench_shortlist_modes():
    args = argparse.Namespace(bench_shortlist=300)
    assert mode_overrides("iad-sl", args) == dict(beam=1, decoding="iad", vocab_shortlist=300)
    assert mode_overrides("greedy-sl", args) == dict(beam=1, decoding="iad", max_draft_len=0, vocab_shortlist=300)
    assert mode_overrides("iad-int8-sl", args)["inference_precision"] == "int8"
    assert mode_overrides("greedy-native-sl", args)["engine"] == "native"
    for bad in ("ct2-sl", "beam5-sl"):
        with pytest.raises(SystemExit, match="-sl applies"):
            mode_overrides(bad, args)
    modes = ["greedy", "greedy-int8", "greedy-sl", "greedy-int8-sl", "iad-sl", "iad-int8-sl", "iad-int8"]
    assert reference_mode("iad-sl", modes) == "greedy-sl"
    assert reference_mode("iad-int8-sl", modes) == "greedy-int8-sl"
    assert reference_mode("iad-int8", modes) == "greedy-int8"
    assert reference_mode("iad-sl", ["greedy", "iad-sl"]) == "greedy"
