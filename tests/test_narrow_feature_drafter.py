"""A feature drafter narrower than its verifier: its decoder reads the
verifier's wider encoder output and features (``feature_proj``) and its own
narrower outputs through a projection of their own (``own_feature_proj``);
the native engine runs such a decoder without an encoder of its own.
Decoding with it is greedy's (torch and native, batch 1 and N); the engine
proposes what torch does; ``widen_model.py --drafter`` makes a drafter of a
narrow model read the widened model and propose exactly what it proposed
beside the narrow one."""
import importlib.util
import os

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_aggressive.criterions.feature_ar_loss import FeatureARLoss
from fairseq_aggressive.drafters import FeatureARDrafter, check_drafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.model_shapes import native_problems
from fairseq_aggressive.native import build
from helpers import ROOT, make_model, make_sample, make_task, model_args, random_rows
from test_gad_shared_drafter import _train_batch, gad_vs_greedy
from test_feature_ar import verifier_and_feature_drafter
from test_gad_verifier_features import AR_OPTS, recorded_proposals, verifier_and_drafter

NATIVE = build.available() is None
ENGINES = ["torch"] + (["native"] if NATIVE else [])
NARROW = dict(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2)


def narrow_pair(task, tmp_path):
    """A verifier of width 32 and a one-layer feature drafter of width 16 on it."""
    ar, dr = verifier_and_feature_drafter(task, tmp_path, **NARROW)
    assert dr.decoder.feature_proj.in_features == 32 and dr.decoder.own_feature_proj is not None
    return ar, dr


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("drafter_engine", ENGINES)
def test_narrow_drafter_decoding_equals_greedy(engine, drafter_engine, tmp_path):
    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path)
    check_drafter(dr, ar, d, feature_ar=True)
    drafter = FeatureARDrafter(dr, d, 4, engine=drafter_engine)
    assert (drafter.native is not None) == (drafter_engine == "native")
    cmp, drafted = gad_vs_greedy(ar, d, drafter, engine, [(1, (1, 10), 10), (6, (1, 30), 60)], 30)
    assert cmp.ok() and cmp.identical == cmp.total == 7, cmp
    assert drafted > 0


def _proposals(ar, dr, d, engine, drafter_engine):
    return recorded_proposals(ar, d, FeatureARDrafter(dr, d, 5, engine=drafter_engine), engine)


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
def test_native_narrow_drafter_proposes_what_torch_does(tmp_path):
    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path)
    torch_calls = _proposals(ar, dr, d, "native", "torch")
    assert len(torch_calls) > 3 and any(len(p) > 1 for c in torch_calls for p in c[2])
    assert _proposals(ar, dr, d, "native", "native") == torch_calls


@pytest.mark.parametrize("drafter_engine", ENGINES)
def test_own_outputs_go_through_their_own_projection(drafter_engine, tmp_path):
    """Changing own_feature_proj changes the proposals after the first drafted
    token (it reads the drafter's own outputs) and not the output (greedy's)."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path)
    before = _proposals(ar, dr, d, "torch", drafter_engine)
    _, dr2 = narrow_pair(task, tmp_path)
    with torch.no_grad():
        dr2.decoder.own_feature_proj.weight.mul_(-6.0)
    after = _proposals(ar, dr2, d, "torch", drafter_engine)
    first = [[p[:1] for p in c[2]] for c in before[:1]]
    assert first == [[p[:1] for p in c[2]] for c in after[:1]]  # the first token reads the verifier's features
    assert before != after
    cmp, _ = gad_vs_greedy(ar, d, FeatureARDrafter(dr2, d, 4, engine=drafter_engine), "torch",
                           [(4, (1, 20), 20)], 30)
    assert cmp.ok() and cmp.identical == cmp.total == 4, cmp


def test_narrow_drafter_refusals(tmp_path):
    task = make_task()
    d = task.target_dictionary
    _, dr = narrow_pair(task, tmp_path)
    with pytest.raises(ValueError, match="trains a drafter as wide as its verifier"):
        FeatureARLoss(task)(dr, _train_batch(d, 2, seed=1))
    assert native_problems(dr) == []  # its decoder runs natively, over the verifier's encoder output
    mixed = make_model(task, seed=2, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2)
    assert "embedding, encoder and output dimensions differ" in native_problems(mixed)  # no shared encoder
    if NATIVE:
        from fairseq_aggressive.native.engine import NativeEngine

        engine = NativeEngine(dr, d)
        src = torch.tensor([[5, 6, 7, d.eos()]])
        with pytest.raises(RuntimeError, match="has no encoder"):
            engine.begin(src, 10)


def _widen_script():
    spec = importlib.util.spec_from_file_location(
        "widen_model", os.path.join(ROOT, "scripts", "experiments", "widen_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_widened_drafter_proposes_as_beside_the_narrow_model(tmp_path):
    """The narrow pair widened (verifier d=32 -> 64, the drafter made to read
    it): every proposal the same as the narrow pair's, in torch and native."""
    widen = _widen_script()
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path, share=True, feature_ar=True, decoder_layers=1)
    share = dict(AR_OPTS, share_all_embeddings=True)
    ar_args = model_args("transformer", **share)
    dr_args = model_args("block_nat", shared_encoder=True, encoder_initialized_from=str(tmp_path / "verifier.pt"),
                         verifier_features=True, block_causal_prefix=True, feature_ar=True, decoder_layers=1,
                         **share)
    wide = widen.widen({"args": ar_args, "model": ar.state_dict()}, 64, 128, 8)
    wide_dr = widen.drafter_for_wide({"args": dr_args, "model": dr.state_dict()}, wide, ar_args, 64, 8,
                                     str(tmp_path / "wide.pt"))
    war = ARCH_MODEL_REGISTRY["transformer"].build_model(wide["args"], task)
    war.load_state_dict(wide["model"])
    wdr = ARCH_MODEL_REGISTRY["block_nat"].build_model(wide_dr["args"], task)
    wdr.load_state_dict(wide_dr["model"])
    war.eval(), wdr.eval()
    assert wdr.decoder.embed_dim == 32 and wdr.decoder.feature_proj.in_features == 64
    check_drafter(wdr, war, d, feature_ar=True)
    # teacher-forced over a batch: the same drafter outputs from the wide encoder output and features
    sample = make_sample(random_rows(d, 4, 3, 20, seed=6), d.pad())
    prev = sample["net_input"]["src_tokens"]  # target-side rows: any tokens will do
    none = torch.zeros_like(prev, dtype=torch.bool)
    outs = []
    for v, m in ((ar, dr), (war, wdr)):
        with torch.no_grad():
            enc = v.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
            feats, _ = v.decoder(prev, encoder_out=enc, features_only=True)
            outs.append(m.decoder.extract_block_features(prev, none, enc, block=none, prefix_feats=feats))
    assert torch.allclose(outs[0], outs[1], atol=1e-4), float((outs[0] - outs[1]).abs().max())
    for drafter_engine in ENGINES:
        narrow = _proposals(ar, dr, d, "torch", drafter_engine)
        assert len(narrow) > 3 and any(len(p) > 1 for c in narrow for p in c[2])
        assert _proposals(war, wdr, d, "torch", drafter_engine) == narrow


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("narrow", [False, True])
def test_feature_drafter_on_an_int8_verifier_equals_its_greedy(engine, narrow, tmp_path):
    """The verifier quantized to int8 (``--inference-precision int8``): drafted
    decoding gives fairseq's greedy output of that int8 model (near-ties counted:
    a pass rounds float parts unlike fairseq's incremental steps, and int8
    activations can turn a last-bit difference into a quantization step)."""
    from fairseq_aggressive.runtime.quantization import quantize_int8
    from helpers import INT8_NEAR_TIE, INT8_SCORE_TOL, compare, greedy

    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path) if narrow else verifier_and_feature_drafter(task, tmp_path)
    ar = quantize_int8(ar)
    cmp, drafted = None, 0
    for bsz, (lo, hi), seed in [(1, (1, 10), 10), (6, (1, 30), 60), (8, (5, 30), 61)]:
        sample = make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad())
        gen = build_generator([ar], d, FeatureARDrafter(dr, d, 4, engine=engine), engine=engine, max_len_b=30)
        cmp = compare(ar, sample, greedy(ar, d, sample, max_len_b=30), gen.generate([ar], sample), cmp,
                      near_tie=INT8_NEAR_TIE, score_tol=INT8_SCORE_TOL)
        drafted += gen.stats.drafted
    assert cmp.ok() and cmp.identical + cmp.near_ties == cmp.total == 15, cmp
    assert drafted > 0
