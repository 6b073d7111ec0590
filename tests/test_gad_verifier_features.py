"""A ``--verifier-features`` block drafter: its prefix tokens also
read the verifier's decoder features that chose them.  GAD with it is greedy
(torch and native verifiers and drafters), the native engine hands over the
features the torch verifier computes, the native drafter proposes what the
torch drafter proposes from them, the features change the proposals, and in
training the verifier runs teacher-forced and frozen and is not saved with the
drafter."""
import argparse

import pytest
import torch
from omegaconf import OmegaConf

from helpers import fast_first, make_model, make_sample, make_task, random_rows
from fairseq_aggressive.criterions.glat_block_loss import GlatBlockLoss
from fairseq_aggressive.drafters import NARBlockDrafter, check_drafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import build
from test_gad_shared_drafter import _train_batch, gad_vs_greedy

NATIVE = build.available() is None
ENGINES = ["torch"] + (["native"] if NATIVE else [])
AR_OPTS = dict(encoder_normalize_before=True, decoder_normalize_before=True)


def save_full_checkpoint(model, args, path):
    """A checkpoint whose config rebuilds ``model`` (what fairseq-train saves)."""
    cfg = OmegaConf.create({"model": args}, flags={"allow_objects": True})
    torch.save({"args": None, "cfg": cfg, "model": model.state_dict(),
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "extra_state": {"train_iterator": {"epoch": 1}}, "last_optimizer_state": {}}, path)


def verifier_and_drafter(task, tmp_path, causal=True, share=False, **drafter_options):
    """A verifier saved as a checkpoint and a --verifier-features block_nat
    drafter on it (``drafter_options`` override the drafter's)."""
    ar_opts = dict(AR_OPTS, share_all_embeddings=share)
    ar = make_model(task, seed=3, **ar_opts)
    args = argparse.Namespace(arch="transformer", encoder_embed_dim=32, encoder_ffn_embed_dim=64,
                              encoder_attention_heads=4, encoder_layers=2, decoder_embed_dim=32,
                              decoder_ffn_embed_dim=64, decoder_attention_heads=4, decoder_layers=2,
                              dropout=0.0, max_source_positions=256, max_target_positions=256, **ar_opts)
    path = tmp_path / "verifier.pt"
    save_full_checkpoint(ar, args, path)
    opts = dict(shared_encoder=True, init_encoder_from=str(path), verifier_features=True, decoder_layers=2,
                block_causal_prefix=causal)
    dr = make_model(task, arch="block_nat", seed=5, **dict(opts, **drafter_options), **ar_opts)
    with torch.no_grad():  # features that matter: a large projection
        dr.decoder.feature_proj.weight.mul_(8.0)
    return ar, dr


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("causal", fast_first([True, False]))
def test_verifier_features_gad_equals_greedy(engine, causal, tmp_path):
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path, causal)
    check_drafter(dr, ar, d)
    assert dr._verifier is not None and not any(k.startswith("_verifier") for k in dr.state_dict())
    cmp, drafted = None, 0
    for drafter_engine in ("auto", "torch"):
        drafter = NARBlockDrafter(dr, d, 4, engine=drafter_engine)
        assert drafter.caps.emitted_features
        assert (drafter.native is not None) == (NATIVE and drafter_engine == "auto")
        cmp, n = gad_vs_greedy(ar, d, drafter, engine, [(1, (1, 10), 10), (6, (1, 30), 60)], 30, cmp)
        drafted += n
    assert cmp.ok() and cmp.identical == cmp.total == 14, cmp
    assert drafted > 0


class Recorder:
    """Wraps a drafter's propose and keeps its proposals."""

    def __init__(self, drafter):
        self.calls = []
        inner = drafter.propose

        def propose(sents, outputs, caps):
            out = inner(sents, outputs, caps)
            self.calls.append((list(sents), [list(o) for o in outputs], [list(p[0].tokens) for p in out]))
            return out

        drafter.propose = propose


def recorded_proposals(ar, d, drafter, engine="native", seed=4, n=5):
    """``drafter``'s proposals, pass after pass, decoding ``n`` random sentences with ``ar``."""
    rec = Recorder(drafter)
    sample = make_sample(random_rows(d, n, 3, 25, seed=seed), d.pad())
    build_generator([ar], d, drafter, engine=engine, max_len_b=30).generate([ar], sample)
    return rec.calls


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
@pytest.mark.parametrize("causal", [True, False])
def test_native_drafter_proposes_what_torch_does(causal, tmp_path):
    """Same verifier (native), drafter in torch vs in the engine: the same
    proposals from the same features, pass after pass; with the features
    zeroed the proposals change (the features reach the drafter)."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path, causal)
    runs = {e: recorded_proposals(ar, d, NARBlockDrafter(dr, d, 4, engine=e)) for e in ("torch", "auto")}
    assert len(runs["torch"]) > 3
    assert runs["torch"] == runs["auto"]

    class Blind(NARBlockDrafter):  # never told the features: all stay zero
        def observe_emitted(self, sents, feats, n_emit):
            for s, ne in zip(sents, n_emit):
                self._n_feats[s] += ne

    blind = recorded_proposals(ar, d, Blind(dr, d, 4))
    first = lambda calls: [(c[0], c[2]) for c in calls[:3]]  # noqa: E731 (same prefixes while outputs agree)
    assert first(blind)[0] == first(runs["auto"])[0]  # the first pass: BOS only, no feature yet
    assert first(blind) != first(runs["auto"])


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
def test_native_features_are_the_torch_verifiers(tmp_path):
    """The features the engine hands over for emitted tokens are those the
    torch verifier computes (teacher-forced over the output)."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path)
    sample = make_sample(random_rows(d, 3, 3, 12, seed=8), d.pad())
    got = {}

    class Keep(NARBlockDrafter):
        def observe_emitted(self, sents, feats, n_emit):
            super().observe_emitted(sents, feats, n_emit)
            o = 0
            for s, ne in zip(sents, n_emit):
                got.setdefault(s, []).append(feats[o : o + ne].clone())
                o += ne

    gen = build_generator([ar], d, Keep(dr, d, 4), engine="native", max_len_b=20)
    hyps = gen.generate([ar], sample)
    net = sample["net_input"]
    for s, h in enumerate(hyps):
        toks = h[0]["tokens"]
        prev = torch.cat([torch.tensor([d.eos()]), toks[:-1]]).unsqueeze(0)
        with torch.no_grad():
            enc = ar.encoder(net["src_tokens"][s : s + 1], src_lengths=net["src_lengths"][s : s + 1])
            ref, _ = ar.decoder(prev, encoder_out=enc, features_only=True)
        assert torch.allclose(torch.cat(got[s]), ref[0], atol=1e-4), s


def test_training_reads_the_frozen_verifier(tmp_path):
    """Block training steps: the projection learns, the verifier (not a
    submodule) stays as it was; the training features are the verifier's,
    shifted one position right."""
    task = make_task(block_size=4)
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path, share=True)
    dr.encoder.load_state_dict(ar.encoder.state_dict())
    verifier_before = {k: v.clone() for k, v in dr._verifier.state_dict().items()}
    sample = _train_batch(d, 4, seed=1)
    net = sample["net_input"]
    enc = dr.encode(net["src_tokens"], net["src_lengths"])
    shifted = dr.verifier_prefix_features(net["prev_output_tokens"], enc)
    with torch.no_grad():
        ref, _ = ar.decoder(net["prev_output_tokens"], encoder_out=enc, features_only=True)
    assert not shifted[:, 0].any() and torch.allclose(shifted[:, 1:], ref[:, :-1], atol=1e-5)
    dr.train()
    crit = GlatBlockLoss(task, glat_start=0.5, glat_end=0.5)
    opt = torch.optim.Adam([p for p in dr.parameters() if p.requires_grad], lr=1e-2)
    w0 = dr.decoder.feature_proj.weight.clone()
    for step in range(2):
        loss, _, log = crit(dr, _train_batch(d, 4, seed=step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(dr.decoder.feature_proj.weight, w0)
    for k, v in dr._verifier.state_dict().items():
        assert torch.equal(v, verifier_before[k]), k
    assert not dr._verifier.training


def test_verifier_features_need_a_shared_encoder(tmp_path):
    task = make_task()
    with pytest.raises(ValueError, match="--verifier-features needs --shared-encoder"):
        make_model(task, arch="block_nat", verifier_features=True)


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
def test_native_drafters_of_one_model_share_its_weights_until_it_changes(tmp_path):
    """A hub model's translate() builds a drafter per call: drafters made one
    after another for one drafter model read one copy of its engine weights
    (slot input and feature projection included) and propose the same tokens;
    a parameter changed in place makes a fresh copy with the new weights."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_drafter(task, tmp_path)
    sample = make_sample(random_rows(d, 4, 3, 12, seed=4), d.pad())
    enc = ar.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])

    def proposals(drafter):
        drafter.begin(sample, 30, enc)
        feats = torch.zeros(4, dr.decoder.feature_proj.in_features)  # the BOS features
        drafter.observe_emitted(list(range(4)), feats, [1] * 4)
        return [p[0].tokens for p in drafter.propose(list(range(4)), [[5]] * 4, [30] * 4)]

    a, b = (NARBlockDrafter(dr, d, 4, engine="native") for _ in range(2))
    assert a.native.engine.weights_id == b.native.engine.weights_id
    assert proposals(a) == proposals(b)
    with torch.no_grad():
        dr.decoder.mask_embed.mul_(-3.0)
    c = NARBlockDrafter(dr, d, 4, engine="native")
    assert c.native.engine.weights_id != a.native.engine.weights_id
    import copy

    fresh = copy.deepcopy(dr)  # another model object with the changed weights: its own copy
    assert proposals(c) == proposals(NARBlockDrafter(fresh, d, 4, engine="native"))
