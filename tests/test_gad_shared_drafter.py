"""Drafters made cheap for CPUs: a ``--shared-encoder`` block drafter
reads the verifier's encoder output (torch and native verifiers), a
``--block-causal-prefix`` drafter's prefix features do not depend on the
block, the frozen encoder stays the verifier's through training, and the
per-slot accuracy counts of the block loss."""
import argparse

import pytest
import torch

from helpers import compare, fast_first, greedy, make_dict, make_model, make_sample, make_task, random_rows
from fairseq_aggressive.criterions.glat_block_loss import GlatBlockLoss, slot_counts
from fairseq_aggressive.drafters import DrafterMismatchError, NARBlockDrafter, check_drafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import build
from test_partial_checkpoint import save_checkpoint

NATIVE = build.available() is None
ENGINES = ["torch"] + (["native"] if NATIVE else [])

VARIANTS = {
    "shared": dict(decoder_layers=2),
    "shared, causal prefix": dict(decoder_layers=2, block_causal_prefix=True),
    "shared, causal prefix, src copy, pre-norm": dict(
        decoder_layers=1, block_causal_prefix=True, block_src_copy=True,
        decoder_normalize_before=True, encoder_normalize_before=True),
}


def shared_drafter(task, ar, tmp_path, seed=5, **kw):
    """A --shared-encoder block_nat drafter whose frozen encoder is ``ar``'s."""
    path = tmp_path / f"verifier{seed}.pt"
    save_checkpoint(ar, path)
    enc_opts = {k: kw[k] for k in ("encoder_normalize_before",) if k in kw}
    dr = make_model(task, arch="block_nat", seed=seed, shared_encoder=True, init_encoder_from=str(path),
                    **enc_opts, **{k: v for k, v in kw.items() if k not in enc_opts})
    return dr


class NoOwnEncoder(torch.nn.Module):
    def forward(self, *a, **k):
        raise AssertionError("a shared-encoder drafter ran its own encoder")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("variant", fast_first(list(VARIANTS)))
def test_shared_encoder_gad_equals_greedy(engine, variant, tmp_path):
    task = make_task()
    d = task.target_dictionary
    opts = VARIANTS[variant]
    ar = make_model(task, seed=3, **{k: v for k, v in opts.items() if k.endswith("normalize_before")})
    dr = shared_drafter(task, ar, tmp_path, **opts)
    check_drafter(dr, ar, d)
    drafter = NARBlockDrafter(dr, d, 4)
    assert drafter.caps.encoder_out
    dr.encoder.forward = NoOwnEncoder().forward  # decoding must not run the drafter's encoder
    cmp, drafted = gad_vs_greedy(ar, d, drafter, engine, [(1, (1, 10), 100 + r) for r in range(3)]
                                 + [(8, (1, 40), 800 + r) for r in range(3)], max_len_b=40)
    assert cmp.ok() and cmp.identical == cmp.total == 27, cmp
    assert drafted > 0


def gad_vs_greedy(ar, d, drafter, engine, batches, max_len_b, cmp=None):
    """Decode random batches ``(size, (min_len, max_len), seed)`` with GAD and with
    fairseq's greedy; the comparison and the drafted positions."""
    drafted = 0
    for bsz, (lo, hi), seed in batches:
        sample = make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad())
        ref = greedy(ar, d, sample, max_len_b=max_len_b)
        gen = build_generator([ar], d, drafter, engine=engine, max_len_b=max_len_b)
        assert (gen.native is not None) == (engine == "native")
        cmp = compare(ar, sample, ref, gen.generate([ar], sample), cmp)
        drafted += gen.stats.drafted
    return cmp, drafted


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
def test_native_encoder_out_is_the_verifiers():
    """The native engine hands out the encoder output fairseq's encoder gives
    (layout, zeros and mask at padding)."""
    from fairseq_aggressive.native import NativeEngine

    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=4)
    sample = make_sample(random_rows(d, 5, 1, 20, seed=7), d.pad())
    src = sample["net_input"]["src_tokens"]
    ref = ar.encoder(src, src_lengths=sample["net_input"]["src_lengths"])
    got = NativeEngine(ar, d).begin(src, 30).encoder_out()
    mask = ref["encoder_padding_mask"][0]
    assert torch.equal(got["encoder_padding_mask"][0], mask)
    keep = ~mask.t()
    assert torch.allclose(got["encoder_out"][0][keep], ref["encoder_out"][0][keep], atol=1e-4)
    assert not got["encoder_out"][0][~keep].any()


def test_shared_encoder_refuses_another_verifier(tmp_path):
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=3)
    dr = shared_drafter(task, ar, tmp_path)
    other = make_model(task, seed=4)
    with pytest.raises(DrafterMismatchError, match="trained on another encoder"):
        check_drafter(dr, other, d)
    sample = make_sample(random_rows(d, 2, 1, 5, seed=1), d.pad())
    with pytest.raises(ValueError, match="verifier's encoder output"):
        NARBlockDrafter(dr, d, 4).begin(sample, 40)  # no encoder output passed


def test_shared_encoder_needs_a_verifier():
    task = make_task()
    with pytest.raises(ValueError, match="--shared-encoder needs --init-encoder-from"):
        make_model(task, arch="block_nat", shared_encoder=True)


def _block_rows(d, prefix, n_slots, seed):
    """``[bos, prefix, slot x n]`` rows (slots hold random non-pad ids)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([[d.eos()] + prefix + [0] * n_slots])
    tokens[0, len(prefix) + 1:] = torch.randint(d.nspecial, len(d), (n_slots,), generator=g)
    slots = torch.zeros_like(tokens, dtype=torch.bool)
    slots[0, len(prefix) + 1:] = True
    return tokens, slots


def test_causal_prefix_features_do_not_depend_on_the_block():
    """Prefix positions of a causal-prefix drafter give the same features
    whatever follows them (so their keys and values can be cached); a
    bidirectional drafter's do not; the fused path equals the training path."""
    from fairseq_aggressive.runtime.layer_ops import encoder_kv

    task = make_task()
    d = task.target_dictionary
    sample = make_sample(random_rows(d, 1, 5, 12, seed=3), d.pad())
    prefix = random_rows(d, 1, 6, 6, seed=4)[0][:6]
    for causal in (True, False):
        dr = make_model(task, arch="block_nat", seed=9, decoder_layers=2, block_causal_prefix=causal)
        enc = dr.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
        feats = []
        for n_slots, seed in ((3, 1), (6, 2)):
            tokens, slots = _block_rows(d, prefix, n_slots, seed)
            with torch.no_grad():
                slow = dr.decoder.extract_block_features(tokens, slots, enc)
                fast = dr.decoder.fast_block_features(tokens, slots, enc, encoder_kv(dr.decoder.layers, enc))
            assert torch.allclose(slow, fast, atol=1e-4)
            feats.append(slow[0, : len(prefix) + 1])
        same = torch.allclose(feats[0], feats[1], atol=1e-5)
        assert same == causal
        # a causal prefix position sees only what precedes it: a later prefix token changes nothing
        if causal:
            tokens, slots = _block_rows(d, prefix[:3] + [d.nspecial] * 3, 3, 1)
            with torch.no_grad():
                other = dr.decoder.extract_block_features(tokens, slots, enc)
            assert torch.allclose(other[0, :4], feats[0][:4], atol=1e-5)
            assert not torch.allclose(other[0, 4:7], feats[0][4:7], atol=1e-3)


def _train_batch(d, bsz, seed):
    src = random_rows(d, bsz, 3, 12, seed=seed)
    tgt = random_rows(d, bsz, 4, 14, seed=seed + 1)
    sample = make_sample(src, d.pad())
    n = max(len(t) for t in tgt)
    target = torch.full((bsz, n), d.pad())
    prev = torch.full((bsz, n), d.pad())
    for i, t in enumerate(tgt):
        target[i, : len(t)] = torch.tensor(t)
        prev[i, : len(t)] = torch.tensor([d.eos()] + t[:-1])
    sample["net_input"]["prev_output_tokens"] = prev
    sample["target"] = target
    sample["id"] = torch.arange(bsz)
    sample["ntokens"] = int(target.ne(d.pad()).sum())
    return sample


@pytest.mark.parametrize("causal", [False, True])
def test_shared_encoder_stays_the_verifiers_through_training(causal, tmp_path):
    """Training steps (glancing, dropout) change the decoder and leave the
    encoder, and with --share-all-embeddings the tied embeddings, exactly the
    verifier's; the encoder runs without dropout in train mode."""
    task = make_task(block_size=4)
    d = task.target_dictionary
    opts = dict(share_all_embeddings=True, dropout=0.3)
    ar = make_model(task, seed=6, **opts)
    dr = shared_drafter(task, ar, tmp_path, block_causal_prefix=causal, **opts)
    dr.encoder.load_state_dict(ar.encoder.state_dict())  # make_model sharpened the tied output layer
    dr.train()
    assert dr.decoder.training and not dr.encoder.training
    before = {k: v.clone() for k, v in dr.state_dict().items()}
    crit = GlatBlockLoss(task, glat_start=0.5, glat_end=0.5)
    opt = torch.optim.Adam([p for p in dr.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        loss, _, log = crit(dr, _train_batch(d, 4, seed=step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = dr.state_dict()
    for k, v in ar.encoder.state_dict().items():
        assert torch.equal(after["encoder." + k], v), k
    changed = [k for k in after if k.startswith("decoder.layers.") and not torch.equal(after[k], before[k])]
    assert changed and torch.equal(after["decoder.embed_tokens.weight"], before["decoder.embed_tokens.weight"])
    assert log["n_revealed"] >= 0 and log["n_slot1"] > 0
    check_drafter(dr.eval(), ar, d)


def test_slot_counts():
    """Per-slot hits and the run of correct leading slots on a crafted case:
    rows with blocks starting at columns 2 and 1 (cut 1 and 0), k = 3."""
    hit = torch.tensor([[0, 0, 1, 1, 0, 1],
                        [0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    counted = torch.tensor([[0, 0, 1, 1, 1, 0],   # slots 1..3 of row 0
                            [0, 1, 1, 0, 0, 0]], dtype=torch.bool)  # slots 1..2 (end of sentence)
    cut = torch.tensor([1, 0])
    out = slot_counts(hit & counted, counted, cut, k=3, leading=True)
    assert out["n_correct"] == 3
    assert (out["n_slot1"], out["n_correct1"]) == (2, 1)   # row 0 right, row 1 wrong
    assert (out["n_slot2"], out["n_correct2"]) == (2, 2)
    assert (out["n_slot3"], out["n_correct3"]) == (1, 0)
    assert out["n_leading"] == 2 + 0 and out["n_rows"] == 2
    everything = slot_counts(counted, counted, cut, k=3, leading=True)
    assert everything["n_leading"] == 3 + 2  # whole blocks right, the short one ends the sentence
    assert "n_leading" not in slot_counts(hit, counted, cut, k=3, leading=False)


@pytest.mark.skipif(not NATIVE, reason="no native engine here")
@pytest.mark.parametrize("variant", ["own encoder", "own encoder, causal prefix", "shared, causal prefix",
                                     "shared, causal prefix, shortlist"])
def test_native_drafter_proposes_what_torch_does(variant, tmp_path):
    """The native drafter (cached causal prefix, or whole rows; a vocabulary
    shortlist) proposes the torch drafter's tokens, pass after pass as outputs
    grow, on a ragged batch."""
    from fairseq_aggressive.shortlist import VocabShortlist

    task = make_task(src_dict=make_dict(60))
    d = task.target_dictionary
    sl = VocabShortlist(d, d, 20) if "shortlist" in variant else None
    ar = make_model(task, seed=3)
    causal = "causal" in variant
    if variant.startswith("shared"):
        dr = shared_drafter(task, ar, tmp_path, decoder_layers=2, block_causal_prefix=causal)
    else:
        dr = make_model(task, arch="block_nat", seed=8, decoder_layers=2, block_causal_prefix=causal)
    native = NARBlockDrafter(dr, d, 5, engine="native", shortlist=sl)
    slow = NARBlockDrafter(dr, d, 5, engine="torch", shortlist=sl)
    assert native.native is not None and native.native.causal == causal and slow.native is None
    sample = make_sample(random_rows(d, 6, 2, 20, seed=1), d.pad())
    enc = ar.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    for drafter in (native, slow):
        drafter.begin(sample, 40, enc)
    assert slow.encoder_out is not None and native.encoder_out is None  # native drafts the batch
    outputs = [[] for _ in range(6)]
    targets = random_rows(d, 6, 20, 30, seed=2)
    same = total = 0
    for step in range(8):
        sents = [s for s in range(6) if not (step > 3 and s % 2)]  # some sentences finish
        caps = [40 - len(outputs[s]) for s in sents]
        a = [p[0].tokens for p in native.propose(sents, [outputs[s] for s in sents], caps)]
        b = [p[0].tokens for p in slow.propose(sents, [outputs[s] for s in sents], caps)]
        for s_, x, y in zip(sents, a, b):
            same += sum(u == v for u, v in zip(x, y))
            total += max(len(x), len(y))
            if sl is not None:  # only the frequent ids and the sentence's source ids
                src = set(sample["net_input"]["src_tokens"][s_].tolist())
                assert all(t < sl.n_common or t in src for t in x), x
        for s in sents:  # accept 1..3 tokens
            outputs[s] += targets[s][len(outputs[s]): len(outputs[s]) + 1 + (s + step) % 3]
    assert total > 150 and same >= 0.98 * total, (same, total)


def test_drafter_engine_errors():
    task = make_task()
    d = task.target_dictionary
    dr = make_model(task, arch="block_nat", decoder_layers=1, block_src_copy=True)
    with pytest.raises(ValueError, match="drafter engine must be one of"):
        NARBlockDrafter(dr, d, 4, engine="fast")
    if NATIVE:
        with pytest.raises(ValueError, match="drafter engine native: .*src-copy"):
            NARBlockDrafter(dr, d, 4, engine="native")
    assert NARBlockDrafter(dr, d, 4).native is None  # auto: torch


def test_bench_drafter_shortlist_modes():
    from fairseq_aggressive.bench.modes import mode_overrides, reference_mode

    args = argparse.Namespace(drafter_path="d.pt", bench_shortlist=300, drafter_bf16=None)
    ov = mode_overrides("gad@8-dsl", args)
    assert ov["decoding"] == "gad" and ov["block_size"] == 8 and ov["drafter_shortlist"] == 300
    assert "vocab_shortlist" not in ov and reference_mode("gad@8-dsl", ["greedy", "gad@8-dsl"]) == "greedy"
    assert mode_overrides("gad@8-torch-dsl", args)["engine"] == "torch"
    with pytest.raises(SystemExit, match="-dsl applies to gad and feature-ar modes"):
        mode_overrides("iad-dsl", args)

