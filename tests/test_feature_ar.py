"""The autoregressive feature drafter (``block_nat --feature-ar``,
``--decoding feature-ar``): decoding with it is greedy (torch and native
verifiers, batch 1 and N); its drafts are the drafter's own autoregressive
choices, each drafted token read with the drafter's output in place of the
verifier's features; its training loss learns the verifier's next tokens and
features; drafters built for another decoding are refused with clear messages."""
import argparse

import pytest
import torch

from fairseq_aggressive.criterions.feature_ar_loss import FeatureARLoss, shift_right
from fairseq_aggressive.drafters import DrafterMismatchError, FeatureARDrafter, check_drafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import build
from helpers import make_model, make_sample, make_task, random_rows
from test_gad_shared_drafter import _train_batch, gad_vs_greedy
from test_gad_verifier_features import (AR_OPTS, Recorder, recorded_proposals, save_full_checkpoint,
                                        verifier_and_drafter)

NATIVE = build.available() is None
ENGINES = ["torch"] + (["native"] if NATIVE else [])


def verifier_and_feature_drafter(task, tmp_path, **extra):
    """A verifier and a one-layer --feature-ar drafter on it (features projected large)."""
    return verifier_and_drafter(task, tmp_path, **dict(dict(feature_ar=True, decoder_layers=1), **extra))


def saved_feature_drafter(dr, tmp_path):
    """``dr`` saved as training saves it (the encoder in the checkpoint): its path."""
    dargs = argparse.Namespace(
        arch="block_nat", encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
        encoder_layers=2, decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_attention_heads=4,
        decoder_layers=1, dropout=0.0, max_source_positions=256, max_target_positions=256, shared_encoder=True,
        encoder_initialized_from=str(tmp_path / "verifier.pt"), verifier_features=True, block_causal_prefix=True,
        feature_ar=True, **AR_OPTS)
    path = tmp_path / "drafter.pt"
    save_full_checkpoint(dr, dargs, path)
    return path


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("drafter_engine", ENGINES)
def test_feature_ar_decoding_equals_greedy(engine, drafter_engine, tmp_path):
    """Verifier and drafter each in torch or in the engine: greedy's output."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    check_drafter(dr, ar, d, feature_ar=True)
    drafter = FeatureARDrafter(dr, d, 4, engine="native" if drafter_engine == "native" else "torch")
    assert drafter.caps.emitted_features and drafter.caps.encoder_out
    assert (drafter.native is not None) == (drafter_engine == "native")
    cmp, drafted = gad_vs_greedy(ar, d, drafter, engine, [(1, (1, 10), 10), (6, (1, 30), 60)], 30)
    assert cmp.ok() and cmp.identical == cmp.total == 7, cmp
    assert drafted > 0


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
def test_native_feature_drafter_proposes_what_torch_does(tmp_path):
    """The same verifier (native), the drafter in torch and in the engine: the
    same proposals pass after pass (the engine's own features fed back)."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    runs = {e: recorded_proposals(ar, d, FeatureARDrafter(dr, d, 5, engine=e)) for e in ("torch", "native")}
    assert len(runs["torch"]) > 3 and any(len(p) > 1 for c in runs["torch"] for p in c[2])
    assert runs["torch"] == runs["native"]


def test_drafts_read_the_drafters_own_features(tmp_path):
    """Each proposal is the drafter's greedy continuation, token after token,
    where a drafted token's input carries the drafter's output at the position
    before it; with the verifier's features there instead, the proposals differ."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    drafter = FeatureARDrafter(dr, d, 4)
    rec = Recorder(drafter)
    sample = make_sample(random_rows(d, 3, 3, 20, seed=2), d.pad())
    build_generator([ar], d, drafter, engine="torch", max_len_b=25).generate([ar], sample)
    assert len(rec.calls) > 3
    enc = ar.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    checked = 0
    for sents, outputs, proposals in rec.calls[:6]:
        for s, out, prop in zip(sents, outputs, proposals):
            idx = torch.tensor([s])
            one = ar.encoder.reorder_encoder_out(enc, idx)
            prev = torch.tensor([[d.eos()] + out])
            with torch.no_grad():
                feats = shift_right(dr.verifier_features(prev, one))  # what chose each token so far
                row, expect = [d.eos()] + out, []
                for _ in prop:
                    toks = torch.tensor([row])
                    none = torch.zeros_like(toks, dtype=torch.bool)
                    h = dr.decoder.extract_block_features(toks, none, one, block=none, prefix_feats=feats)
                    logits = dr.decoder.output_layer(h[0, -1])
                    logits[d.pad()] = -float("inf")
                    t = int(logits.argmax())
                    expect.append(t)
                    row.append(t)
                    feats = torch.cat([feats, h[:, -1:]], dim=1)  # its own output stands in
                    if t == d.eos():
                        break
            assert prop == expect
            checked += 1
    assert checked > 3


def test_feature_ar_training_learns_the_verifiers_tokens_and_features(tmp_path):
    """A few steps on one batch lower both parts of the loss and raise the
    next-token accuracy with the verifier's features and with the drafter's own;
    the encoder, embeddings and output projection stay the verifier's."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    crit = FeatureARLoss(task, label_smoothing=0.0, own_feature_rate=0.5)
    sample = _train_batch(d, 8, seed=3)
    # the target: the verifier's own choices (what a drafter trained on its outputs sees)
    with torch.no_grad():
        enc = ar.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
        out, _ = ar.decoder(sample["net_input"]["prev_output_tokens"], encoder_out=enc)
    pad = sample["target"].eq(d.pad())
    sample["target"] = out.argmax(-1).masked_fill(pad, d.pad())
    frozen = {k: v.clone() for k, v in dr.state_dict().items() if k.startswith("encoder.")}
    opt = torch.optim.Adam([p for p in dr.parameters() if p.requires_grad], lr=3e-3)
    first = last = None
    for step in range(60):
        dr.train()
        loss, n, log = crit(dr, sample)
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
        first = first or log
        last = log
    assert float(last["nll_loss"]) < 0.5 * float(first["nll_loss"])
    assert float(last["feature_loss"]) < float(first["feature_loss"])
    assert last["n_correct"] > first["n_correct"] and last["n_correct_own"] > first["n_correct_own"]
    assert last["own_pass"] == 1
    for k, v in dr.state_dict().items():
        if k in frozen:
            assert torch.equal(v, frozen[k]), k
    dr.eval()
    _, _, log = crit(dr, sample)
    assert log["own_pass"] == 0 and log["n_correct_own"] == 0  # validation: the verifier's features only


def test_refusals(tmp_path):
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    with pytest.raises(DrafterMismatchError, match="--decoding feature-ar"):
        check_drafter(dr, ar, d)  # GAD with a feature drafter
    with pytest.raises(ValueError, match="--feature-ar drafter"):
        FeatureARDrafter(make_model(task, seed=1), d, 4)  # not a drafter at all
    _, gad = verifier_and_feature_drafter(task, tmp_path, feature_ar=False)
    with pytest.raises(DrafterMismatchError, match="this one is GAD's block drafter"):
        check_drafter(gad, ar, d, feature_ar=True)
    with pytest.raises(ValueError, match="--feature-ar needs --block-causal-prefix --verifier-features"):
        verifier_and_feature_drafter(task, tmp_path, block_causal_prefix=False)
    wide = make_model(task, seed=3, encoder_embed_dim=48, decoder_embed_dim=48, **AR_OPTS)
    with pytest.raises(DrafterMismatchError, match="features of width 32, the verifier's are 48 wide"):
        check_drafter(dr, wide, d, feature_ar=True)  # another verifier's dimensions
    with pytest.raises(ValueError, match="trains a --feature-ar drafter"):
        FeatureARLoss(task)(gad, _train_batch(d, 2, seed=1))


def test_decoding_feature_ar_through_the_task(tmp_path):
    """--decoding feature-ar --drafter-path CKPT builds the feature drafter
    (its trained checkpoint reloaded) and gives greedy's output; GAD refuses
    that checkpoint."""
    from helpers import compare, greedy

    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    path = saved_feature_drafter(dr, tmp_path)
    args = argparse.Namespace(decoding="feature-ar", drafter_path=str(path), block_size=3, beam=1, nbest=1,
                              max_len_b=30)
    gen = task.build_generator([ar], args)
    assert isinstance(gen.drafter, FeatureARDrafter) and gen.drafter.k == 3
    sample = make_sample(random_rows(d, 5, 2, 20, seed=9), d.pad())
    assert compare(ar, sample, greedy(ar, d, sample, max_len_b=30), gen.generate([ar], sample)).ok()
    assert gen.stats.drafted > 0
    with pytest.raises(DrafterMismatchError, match="--decoding feature-ar"):
        task.build_generator([ar], argparse.Namespace(decoding="gad", drafter_path=str(path), beam=1, nbest=1))


@pytest.mark.parametrize("drafter_engine", ENGINES)
def test_drafter_shortlist_keeps_greedy(drafter_engine, tmp_path):
    """--drafter-shortlist: the drafter proposes from the shortlist only (the
    frequent tokens and each sentence's source tokens); the output stays greedy's."""
    from fairseq_aggressive.shortlist import VocabShortlist

    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    shortlist = VocabShortlist(task.source_dictionary, d, 12)
    drafter = FeatureARDrafter(dr, d, 4, engine=drafter_engine, shortlist=shortlist)
    rec = Recorder(drafter)
    cmp, drafted = gad_vs_greedy(ar, d, drafter, "native" if NATIVE else "torch", [(4, (2, 20), 21)], 30)
    assert cmp.ok() and cmp.identical == cmp.total == 4, cmp
    assert drafted > 0
    sample = make_sample(random_rows(d, 4, 2, 20, seed=21), d.pad())
    allowed = shortlist.allowed(sample["net_input"]["src_tokens"])
    for sents, _, proposals in rec.calls:
        for s, p in zip(sents, proposals):
            assert all(bool(allowed[s, t]) for t in p), (s, p)


def test_int8_drafter_through_the_task(tmp_path):
    """--drafter-precision int8: an int8 copy of the drafter proposes (the task's float drafter
    stays float), the engine's int8 drafter proposes what the torch int8 drafter does, and the
    output stays the verifier's greedy; GAD's block drafter takes the option too."""
    from fairseq_aggressive.runtime.quantization import is_int8
    from helpers import compare, greedy

    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    path = saved_feature_drafter(dr, tmp_path)

    def build(**kw):
        return task.build_generator([ar], argparse.Namespace(decoding="feature-ar", drafter_path=str(path),
                                                             block_size=4, beam=1, nbest=1, max_len_b=30, **kw))

    assert build(draft_confidence=0.3).drafter.min_prob == 0.3
    with pytest.raises(ValueError, match=r"--draft-confidence must be in \[0, 1\)"):
        build(draft_confidence=-0.1)
    gen8 = build(drafter_precision="int8")
    gen32 = build()
    assert is_int8(gen8.drafter.model) and not is_int8(gen32.drafter.model)
    assert (gen8.drafter.native is not None) == NATIVE
    sample = make_sample(random_rows(d, 6, 2, 20, seed=9), d.pad())
    ref = greedy(ar, d, sample, max_len_b=30)
    cmp = compare(ar, sample, ref, gen8.generate([ar], sample))
    assert cmp.ok() and cmp.identical == cmp.total == 6, cmp
    assert gen8.stats.accepted > 0
    if NATIVE:
        int8_dr = gen8.drafter.model
        runs = {e: recorded_proposals(ar, d, FeatureARDrafter(int8_dr, d, 5, engine=e)) for e in ("torch", "native")}
        assert len(runs["torch"]) > 3 and runs["torch"] == runs["native"]
    with pytest.raises(ValueError, match="--drafter-precision int8 and --drafter-bf16 on"):
        build(drafter_precision="int8", drafter_bf16="on")
    with pytest.raises(ValueError, match="--drafter-precision must be one of float32, int8"):
        build(drafter_precision="int4")


def _draft_lengths(calls):
    return [len(p) for _, _, proposals in calls for p in proposals]


@pytest.mark.parametrize("engine", ENGINES)
def test_draft_confidence_ends_drafts_where_the_drafter_is_unsure(engine, tmp_path):
    """--draft-confidence P: a draft ends after its first token whose probability under the
    drafter is below P (checked against the drafter's own softmax in torch); the engine's
    drafter ends the same drafts as torch's; the output stays greedy's."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    probe = FeatureARDrafter(dr, d, 6, engine="torch", min_prob=0.0)
    seen = []
    real = dr.decoder.output_layer

    def top(logits):  # the drafter's top probability (padding is never drafted)
        logits = logits.detach().float().clone()
        logits[:, d.pad()] = -float("inf")
        return logits.softmax(-1).amax(-1)

    def record(x):  # at each drafting step
        out = real(x)
        seen.extend(top(out).tolist())
        return out

    dr.decoder.output_layer = record
    full = _draft_lengths(recorded_proposals(ar, d, probe))
    dr.decoder.output_layer = real
    p = sorted(seen)[len(seen) // 3]  # a third of the steps below it
    runs = {e: recorded_proposals(ar, d, FeatureARDrafter(dr, d, 6, engine=e, min_prob=p)) for e in ENGINES}
    lengths = _draft_lengths(runs[engine])
    assert max(full) == 6 and sum(lengths) / len(lengths) < sum(full) / len(full)
    assert 1 in lengths
    if NATIVE:
        assert runs["torch"] == runs["native"]
    # the rule itself, one sentence in torch: per draft, each step's top probability
    checker = FeatureARDrafter(dr, d, 6, engine="torch", min_prob=p)
    rec = Recorder(checker)
    caps, inner = [], checker.propose
    checker.propose = lambda sents, outputs, c: caps.append(c[0]) or inner(sents, outputs, c)
    steps = []

    def per_draft(x):
        out = real(x)
        steps.append((len(rec.calls), float(top(out)[0])))
        return out

    dr.decoder.output_layer = per_draft
    sample = make_sample(random_rows(d, 1, 20, 25, seed=3), d.pad())
    build_generator([ar], d, checker, engine="torch", max_len_b=30).generate([ar], sample)
    dr.decoder.output_layer = real
    assert len(rec.calls) > 2
    for i, (_, outputs, proposals) in enumerate(rec.calls):
        probs = [q for call, q in steps if call == i]
        prop = proposals[0]
        assert len(probs) == len(prop) and all(q >= p for q in probs[:-1]), (probs, p)
        if len(prop) < min(6, caps[i]) and prop[-1] != d.eos():
            assert probs[-1] < p, (probs, p)
    sure = FeatureARDrafter(dr, d, 6, engine=engine, min_prob=0.999999)
    assert set(_draft_lengths(recorded_proposals(ar, d, sure))) == {0, 1}  # (0: a sentence at its length cap)
    cmp, drafted = gad_vs_greedy(ar, d, FeatureARDrafter(dr, d, 6, engine=engine, min_prob=p),
                                 "native" if NATIVE else "torch", [(1, (1, 10), 10), (6, (1, 30), 60)], 30)
    assert cmp.ok() and cmp.identical == cmp.total == 7, cmp
    with pytest.raises(ValueError, match=r"--draft-confidence must be in \[0, 1\)"):
        FeatureARDrafter(dr, d, 6, min_prob=1.0)
