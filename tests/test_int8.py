"""Opt-in int8 inference (--inference-precision int8): the int8 linear layer's
arithmetic, aggressive decoding against fairseq greedy of the same int8 model
(torch verifier and native engine), the engine's bit-exactness (aggressive ==
its own greedy, AVX2 == generic build), the task option and the bench modes."""
import argparse
import random

import numpy as np
import pytest
import torch

from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import NativeEngine, build
from fairseq_aggressive.runtime.quantization import Int8Linear, is_int8, quantize_int8
from helpers import (INT8_NEAR_TIE, INT8_SCORE_TOL, compare, fast_first, greedy, make_model, make_sample, make_task,
                     needs_native)
from test_equivalence import NoisyOracleDrafter, batches, random_sources
from test_native import OTHER_TARGETS, TARGET_SETS, Oracle, _decode, _same_bits



def _reference_int8(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The documented arithmetic, written out with numpy integers."""
    f32 = np.float32

    def q(rows):
        amax = np.abs(rows).max(axis=1, keepdims=True).astype(f32)
        inv = f32(127) / np.where(amax == 0, f32(1), amax)
        return np.clip(np.rint(rows * inv), -127, 127).astype(np.int64), (amax / f32(127)).astype(f32)

    qx, sx = q(x)
    qw, sw = q(w)
    acc = (qx @ qw.T).astype(f32)  # exact integers, rounded once to float32
    return acc * (sx * sw.reshape(1, -1)) + b


@pytest.mark.parametrize("k", [7, 128, 2048])  # odd K; float32 partial sums; float64 partial sums
def test_int8_linear_is_the_documented_integer_arithmetic(k):
    g = torch.Generator().manual_seed(k)
    lin = torch.nn.Linear(k, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, k, generator=g) * 3)
        lin.weight[5].zero_()  # a zero row: scale 0
    x = torch.randn(3, 5, k, generator=g) * 10
    x[1, 2].zero_()  # a zero activation row
    q = Int8Linear(lin)
    assert q.qweight.dtype == torch.int8 and int(q.qweight.abs().max()) == 127
    y = q(x)
    ref = _reference_int8(x.reshape(-1, k).numpy(), lin.weight.detach().numpy(), lin.bias.detach().numpy())
    assert np.array_equal(y.reshape(-1, 24).numpy(), ref)
    # each position is quantized on its own: a position's result is the same alone or in a batch
    assert torch.equal(q(x[2:3, 4:5]), y[2:3, 4:5])
    # and close to float32 (int8 rounding only)
    with torch.no_grad():
        rel = (y - lin(x)).norm() / lin(x).norm()
    assert 0 < float(rel) < 0.03


def test_quantize_int8_replaces_every_linear_once():
    task = make_task()
    model = make_model(task, seed=1)  # 2 + 2 layers
    assert not is_int8(model)
    quantize_int8(model)
    n = sum(isinstance(m, Int8Linear) for m in model.modules())
    assert n == 2 * 6 + 2 * 10 + 1  # encoder q k v out fc1 fc2, decoder + encoder attention, projection
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    quantize_int8(model)
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == n


@pytest.mark.parametrize("engine,bsz", fast_first([("native", 8), ("torch", 8), ("native", 1)], n=2))
def test_int8_aggressive_matches_fairseq_greedy_of_the_int8_model(engine, bsz):
    if engine == "native" and build.available() is not None:
        pytest.skip("no native engine here")
    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=11, encoder_normalize_before=True, decoder_normalize_before=True))
    float_model = make_model(task, seed=11, encoder_normalize_before=True, decoder_normalize_before=True)
    rng = random.Random(bsz)
    rows = random_sources(rng, 16, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    # both verifiers round float parts differently from fairseq's incremental steps, and int8
    # activations turn a last-bit difference into a quantization step now and then
    tol = dict(near_tie=INT8_NEAR_TIE, score_tol=INT8_SCORE_TOL)
    cmp, accepted, changed = None, 0, 0
    for chunk in batches(rows, bsz):
        sample = make_sample(chunk, d.pad())
        ref = greedy(model, d, sample, max_len_b=40)
        fp32 = greedy(float_model, d, sample, max_len_b=40)
        changed += sum(a[0]["tokens"].tolist() != b[0]["tokens"].tolist() for a, b in zip(ref, fp32))
        for drafter in (InputCopyDrafter(d, d), NoisyOracleDrafter(ref, rng, 0.1, len(d))):
            gen = build_generator([model], d, drafter, engine=engine, max_len_b=40)
            assert (gen.native is not None) == (engine == "native")
            cmp = compare(model, sample, ref, gen.generate([model], sample), cmp, **tol)
            accepted += gen.stats.accepted
    assert cmp.ok(), cmp
    assert cmp.identical + cmp.near_ties == 2 * len(rows)
    assert accepted > 0
    assert changed > 0  # the int8 model is a different model: some of its greedy outputs differ


@needs_native
def test_native_refuses_a_partly_int8_model():
    from fairseq_aggressive.native import NativeUnavailable
    from fairseq_aggressive.runtime.quantization import Int8Linear

    task = make_task()
    model = make_model(task, seed=6)
    model.decoder.layers[0].fc1 = Int8Linear(model.decoder.layers[0].fc1)
    with pytest.raises(NativeUnavailable, match="int8 and .* float linear layers"):
        NativeEngine(model, task.target_dictionary)


@needs_native
@pytest.mark.parametrize("others", TARGET_SETS)
def test_native_int8_is_bit_exact(others):
    """Integer products are exact and each position is quantized on its own:
    the engine's int8 aggressive decoding equals its int8 greedy bit for bit,
    at any batch and draft cap, and every build target this CPU runs (int8 in
    pairs or, in the AVX-512 VNNI layout, in groups of four) gives the same bits."""
    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=5, encoder_attention_heads=2, decoder_attention_heads=2))
    rng = random.Random(3)
    rows = random_sources(rng, 16, len(d), d.eos()) + random_sources(rng, 24, len(d), d.eos(), repeat=True)
    ref, g0 = _decode(model, task, rows, 1, max_len_b=40, max_draft_len=0)
    assert g0.native.int8_linears == 2 * 4 + 2 * 7 + 1 and g0.stats.drafted == 0
    for bsz, lmax in ((1, None), (8, 1024), (8, 3)):
        drafter = Oracle(ref, rng, 0.1, len(d))
        out, gen = _decode(model, task, rows, bsz, drafter=drafter, max_len_b=40, max_draft_len=lmax)
        assert gen.stats.accepted > 0
        _same_bits(ref, out)
        _same_bits(ref, _decode(model, task, rows, bsz, max_len_b=40, max_draft_len=lmax)[0])  # IAD
    for isa in others:
        other = NativeEngine(model, d, isa=isa)
        assert other.int8_linears == g0.native.int8_linears
        _same_bits(ref, _decode(model, task, rows, 4, native=other, max_len_b=40)[0])


def test_inference_precision_option_quantizes_for_every_decoding():
    from fairseq_aggressive.bench.modes import mode_overrides

    task = make_task()
    d = task.target_dictionary
    rows = random_sources(random.Random(2), 8, len(d), d.eos())
    sample = make_sample(rows, d.pad())
    for decoding in ("beam", "iad"):
        model = make_model(task, seed=4)
        args = argparse.Namespace(beam=1, nbest=1, decoding=decoding, inference_precision="int8", max_len_b=30)
        gen = task.build_generator([model], args)
        assert is_int8(model)
        out = gen.generate([model], sample)
        assert all(len(o[0]["tokens"]) > 0 for o in out)
    model = make_model(task, seed=4)
    task.build_generator([model], argparse.Namespace(beam=1, nbest=1, decoding="iad", max_len_b=30))
    assert not is_int8(model)  # float32 is the default
    # an int8 model asked for float32 (a hub model quantized by an earlier call): refused
    int8_model = quantize_int8(make_model(task, seed=4))
    with pytest.raises(ValueError, match="quantized in place .* load it again"):
        task.build_generator([int8_model], argparse.Namespace(beam=1, nbest=1, decoding="beam", max_len_b=30))
    args = argparse.Namespace(drafter_path=None)
    assert mode_overrides("iad-int8", args) == dict(beam=1, decoding="iad", inference_precision="int8")
    assert mode_overrides("greedy-native-int8", args) == dict(
        beam=1, decoding="iad", max_draft_len=0, engine="native", inference_precision="int8")
    assert mode_overrides("ct2-int8", args) == {}


@pytest.mark.slow
@needs_native
def test_native_int8_prefetching_model_is_bit_exact():
    """A model whose int8 weights outgrow the caches (Transformer-big's layer
    shape, one layer a side: the tiles ask for their weights ahead, in the
    encoder's blocks of rows and in the decoder's passes) decodes IAD and accepted noisy drafts bit for bit as its int8
    greedy, at batch 1 and 8, and every other target gives the same bits."""
    from fairseq_aggressive.runtime.quantization import Int8Linear

    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=23, encoder_layers=1, decoder_layers=1, encoder_embed_dim=1024,
                                     decoder_embed_dim=1024, encoder_ffn_embed_dim=4096,
                                     decoder_ffn_embed_dim=4096, encoder_attention_heads=16,
                                     decoder_attention_heads=16))
    for part in (model.encoder, model.decoder):  # each beyond kPrefetchModelBytes (csrc/cpu/linear.h)
        assert sum(m.qweight.numel() for m in part.modules() if isinstance(m, Int8Linear)) >= 8 << 20
    rng = random.Random(24)
    rows = random_sources(rng, 8, len(d), d.eos()) + random_sources(rng, 8, len(d), d.eos(), repeat=True)
    ref, _ = _decode(model, task, rows, 1, max_len_b=20, max_draft_len=0)
    for bsz in (1, 8):
        out, gen = _decode(model, task, rows, bsz, drafter=Oracle(ref, rng, 0.2, len(d)), max_len_b=20)
        assert gen.stats.accepted > 0
        _same_bits(ref, out)
        _same_bits(ref, _decode(model, task, rows, bsz, max_len_b=20)[0])
    for isa in OTHER_TARGETS:  # (drafts as made: the draft-length policy's first measurement is slow on generic)
        _same_bits(ref, _decode(model, task, rows, 8, native=NativeEngine(model, d, isa=isa), max_len_b=20,
                                draft_cost="off")[0])
