"""GAD / GAD++ on random-weight verifier/drafter pairs: greedy equivalence of
exact GAD for any drafter, block training
inputs (the rules on crafted scores: test_acceptance.py), and the errors raised before decoding."""
import argparse

import pytest
import torch

from helpers import aggressive, compare, fast_first, greedy, make_dict, make_model, make_sample, make_task, random_rows
from fairseq_aggressive.acceptance import ExactAcceptance, TopBetaTauAcceptance
from fairseq_aggressive.criterions.glat_block_loss import make_blocks, reveal
from fairseq_aggressive.drafters import DrafterMismatchError, NARBlockDrafter, check_drafter
from fairseq_aggressive.verifiers import UnsupportedModelError, check_supported


VERIFIERS = [
    dict(),
    dict(decoder_layers=3, encoder_layers=1, decoder_normalize_before=True, encoder_normalize_before=True),
    dict(decoder_learned_pos=True, share_all_embeddings=True, decoder_embed_dim=32),
]
DRAFTERS = [
    dict(decoder_layers=1),
    dict(decoder_layers=2, block_src_copy=True, decoder_learned_pos=True),
    dict(decoder_layers=2, block_causal_prefix=True, decoder_normalize_before=True),
]


@pytest.mark.slow  # minutes each on 2 busy cores
@pytest.mark.parametrize("vi", range(len(VERIFIERS)))
@pytest.mark.parametrize("k", [1, 2, 5, 25])
def test_exact_gad_equals_greedy_random_weights(vi, k):
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=vi, **VERIFIERS[vi])
    dr = make_model(task, arch="block_nat", seed=10 + vi, **DRAFTERS[vi % len(DRAFTERS)])
    cmp = None
    for bsz, (lo, hi) in ((1, (1, 8)), (8, (1, 40)), (8, (20, 60))):
        for rep in range(2):
            rows = random_rows(d, bsz, lo, hi, seed=1000 * vi + 10 * k + rep + hi)
            sample = make_sample(rows, d.pad())
            for opts in (dict(max_len_b=50), dict(max_len_a=1.0, max_len_b=3, min_len=2)):
                ref = greedy(ar, d, sample, **opts)
                out, gen = aggressive(ar, task, sample, drafter=NARBlockDrafter(dr, d, k), **opts)
                cmp = compare(ar, sample, ref, out, cmp)
                assert gen.stats.drafted > 0
    assert cmp.ok(), cmp


class GreedyOracleBlockModel(torch.nn.Module):
    """A stand-in block drafter whose ``block_logits`` give the verifier's own
    greedy continuation (full forwards), with every ``wrong_every``-th drafted
    token corrupted: exercises long accepted runs and late rejections through
    NARBlockDrafter.  The greedy next token of a (source, prefix) is computed
    once and kept in ``memo`` (share one between oracles of the same ``ar``):
    the next pass asks again for most of the continuation it was given, and a
    second decode of the same samples asks for all of it."""

    is_block_drafter = True

    def __init__(self, ar, d, wrong_every=0, memo=None):
        super().__init__()
        self.ar, self.d, self.wrong_every = ar, d, wrong_every
        self.encoder = ar.encoder
        self.decoder = argparse.Namespace(max_positions=lambda: 10_000)
        self.calls = 0
        self.memo = {} if memo is None else memo

    def _next(self, source, prefix, enc):
        key = (source, tuple(prefix))
        if key not in self.memo:
            lp = self.ar.decoder(torch.tensor([prefix]), encoder_out=enc)[0][0, -1]
            lp[self.d.pad()] = -1e9
            self.memo[key] = int(lp.argmax())
        return self.memo[key]

    @torch.no_grad()
    def block_logits(self, tokens, slots, encoder_out):
        out = []
        for r, (row, sl) in enumerate(zip(tokens, slots)):
            prefix = row[~sl & row.ne(self.d.pad())].tolist()
            enc = self.ar.encoder.reorder_encoder_out(encoder_out, torch.tensor([r]))
            source = (enc["encoder_out"][0].numpy().tobytes(), enc["encoder_padding_mask"][0].numpy().tobytes())
            cont = []
            for _ in range(int(sl.sum())):
                cont.append(self._next(source, prefix + cont, enc))
            for t in cont:
                self.calls += 1
                if self.wrong_every and self.calls % self.wrong_every == 0:
                    t = self.d.nspecial + (t + 1 - self.d.nspecial) % (len(self.d) - self.d.nspecial)
                logit = torch.full((len(self.d),), -10.0)
                logit[t] = 10.0
                out.append(logit)
        return torch.stack(out)


@pytest.mark.parametrize("wrong_every", fast_first([3, 0, 7]))
@pytest.mark.parametrize("bsz", fast_first([8, 1]))
def test_exact_gad_long_accepted_blocks(wrong_every, bsz):
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=21)
    rows = random_rows(d, bsz, 2, 30, seed=22 + bsz + wrong_every)
    sample = make_sample(rows, d.pad())
    ref = greedy(ar, d, sample, max_len_b=40)
    oracle = GreedyOracleBlockModel(ar, d, wrong_every)
    out, gen = aggressive(ar, task, sample, drafter=NARBlockDrafter(oracle, d, 6), max_len_b=40)
    cmp = compare(ar, sample, ref, out)
    assert cmp.ok(), cmp
    if wrong_every == 0:  # perfect drafts: about one pass per 7 tokens (6 drafted + 1)
        assert gen.stats.as_dict()["mean_tokens_per_pass"] > 4
    assert gen.stats.accepted > 0


@pytest.mark.slow
def test_gadpp_beta1_equals_exact():
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=3)
    dr = make_model(task, arch="block_nat", seed=4)
    rows = random_rows(d, 8, 1, 30, seed=5)
    sample = make_sample(rows, d.pad())
    # a random drafter, and greedy's own tokens with every 4th one wrong: drafts
    # pass and fail, so the two rules are compared where they decide something
    # (the oracle counts its calls to place the wrong tokens: a fresh one per run)
    memo = {}
    for drafter_model in (lambda: dr, lambda: GreedyOracleBlockModel(ar, d, 4, memo)):
        exact, g1 = aggressive(ar, task, sample, drafter=NARBlockDrafter(drafter_model(), d, 5),
                               acceptance=ExactAcceptance())
        pp, g2 = aggressive(ar, task, sample, drafter=NARBlockDrafter(drafter_model(), d, 5),
                            acceptance=TopBetaTauAcceptance(1, 100.0))
        for a, b in zip(exact, pp):
            assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
            assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-5)
        assert (g1.stats.accepted, g1.stats.passes) == (g2.stats.accepted, g2.stats.passes)
    assert g2.stats.accepted > 0 and g2.stats.accepted < g2.stats.drafted


def test_gadpp_scores_are_verifier_logprobs_of_emitted_tokens():
    """GAD++ may emit non-greedy tokens; their reported scores must be the
    verifier's log-probs of exactly those tokens (checked by a full forward)."""
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=6)
    dr = make_model(task, arch="block_nat", seed=7)
    rows = random_rows(d, 6, 3, 25, seed=8)
    sample = make_sample(rows, d.pad())
    out, gen = aggressive(ar, task, sample, drafter=NARBlockDrafter(dr, d, 6),
                          acceptance=TopBetaTauAcceptance(40, 100.0), max_len_b=30)
    assert gen.stats.accepted > 0  # top-40 of 40 symbols with tau=100: drafts pass
    net = sample["net_input"]
    for i, hyp in enumerate(out):
        toks = hyp[0]["tokens"]
        prev = torch.cat([torch.tensor([d.eos()]), toks[:-1]]).unsqueeze(0)
        with torch.no_grad():
            o = ar(net["src_tokens"][i : i + 1], net["src_lengths"][i : i + 1], prev)
            lp = ar.get_normalized_probs(o, log_probs=True)[0]
        expect = lp.gather(1, toks.unsqueeze(1)).squeeze(1)
        assert torch.allclose(hyp[0]["positional_scores"], expect, atol=1e-4)


# ------------------------------------------------------- block training inputs
def test_make_blocks_layout():
    pad, eos = 1, 2
    target = torch.tensor([[10, 11, 12, 13, eos], [20, 21, eos, pad, pad]])
    prev = torch.tensor([[eos, 10, 11, 12, 13], [eos, 20, 21, pad, pad]])
    tokens, slots, tgt = make_blocks(prev, target, pad, 3, torch.tensor([2, 1]))
    # row 0: bos y1 y2 | slots for y3 y4 eos
    assert tokens[0].tolist() == [eos, 10, 11, 12, 13, eos]
    assert slots[0].tolist() == [False, False, False, True, True, True]
    assert tgt[0].tolist() == [pad, pad, pad, 12, 13, eos]
    # row 1: bos y1 | slots for y2 eos (third slot past the end: ignored), then pad
    assert slots[1].tolist() == [False, False, True, True, True, False]
    assert tgt[1].tolist() == [pad, pad, 21, eos, pad, pad]
    assert tokens[1, :2].tolist() == [eos, 20] and tokens[1, 5].item() == pad
    assert tokens[1, 4].item() != pad  # an ignored slot still gets a position


def test_reveal_counts_only_wrong_slots():
    wrong = torch.tensor([[True, False, True, True, False, True], [False] * 6, [True] * 6])
    torch.manual_seed(0)
    shown = reveal(wrong, 0.5)
    assert shown.sum(1).tolist() == [2, 0, 3]
    assert not bool((shown & ~wrong).any())
    assert reveal(wrong, 0.0).sum().item() == 0


# ------------------------------------------------------------------ errors
def test_drafter_errors():
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task)
    with pytest.raises(ValueError, match="--block-size"):
        NARBlockDrafter(make_model(task, arch="block_nat"), d, 0)
    with pytest.raises(DrafterMismatchError, match="block_nat"):
        check_drafter(ar, ar, d)
    other = make_task(make_dict(50))
    with pytest.raises(DrafterMismatchError, match="dictionaries differ"):
        check_drafter(make_model(other, arch="block_nat"), ar, d)
    with pytest.raises(UnsupportedModelError, match="drafter"):
        check_supported(make_model(task, arch="block_nat"))
    with pytest.raises(ValueError, match="--block-size"):
        make_task(block_size=0)
    with pytest.raises(ValueError, match="--gad-beta"):
        make_task(gad_beta=0)
    with pytest.raises(ValueError, match="--gad-tau"):
        make_task(gad_tau=-1.0)
    # GAD++'s tolerance is stated, never a silent 0 beside a top-beta above 1
    with pytest.raises(ValueError, match="--gad-beta 3 needs --gad-tau: .* 3 --gad-tau 1.0"):
        make_task(gad_beta=3)
    assert make_task(gad_beta=3, gad_tau=1.0) is not None


def test_gad_without_drafter_is_refused():
    task = make_task(decoding="gad")
    ar = make_model(task)
    with pytest.raises(ValueError, match="--drafter-path"):
        task.build_generator([ar], argparse.Namespace(beam=1))
    task = make_task(decoding="gad", drafter_path="/nonexistent/drafter.pt")
    with pytest.raises(FileNotFoundError, match="drafter"):
        task.build_generator([ar], argparse.Namespace(beam=1))


def test_block_nat_cannot_decode_alone():
    task = make_task()
    dr = make_model(task, arch="block_nat")
    with pytest.raises(ValueError, match="drafter"):
        dr.decoder(torch.tensor([[2, 5]]), None)


@pytest.mark.parametrize("di", range(len(DRAFTERS)))
def test_drafter_fast_path_matches_training_path(di):
    """The drafter's inference path (precomputed encoder K/V, fused attention)
    computes the same features as the training path, on ragged batches."""
    from fairseq_aggressive.runtime.layer_ops import encoder_kv

    task = make_task()
    d = task.target_dictionary
    dr = make_model(task, arch="block_nat", seed=30 + di, **DRAFTERS[di])
    rows = random_rows(d, 5, 1, 20, seed=di)
    sample = make_sample(rows, d.pad())
    outs = random_rows(d, 5, 0, 12, seed=50 + di)
    width = 1 + max(len(o) for o in outs) + 4
    tokens = torch.full((5, width), d.pad())
    slots = torch.zeros(5, width, dtype=torch.bool)
    for i, o in enumerate(outs):
        tokens[i, : len(o) + 5] = torch.tensor([d.eos()] + o + [d.unk()] * 4)
        slots[i, len(o) + 1 : len(o) + 5] = True
    enc = dr.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    with torch.no_grad():
        slow = dr.decoder.extract_block_features(tokens, slots, enc)
        fast = dr.decoder.fast_block_features(tokens, slots, enc, encoder_kv(dr.decoder.layers, enc))
    keep = tokens.ne(d.pad())
    assert torch.allclose(slow[keep], fast[keep], atol=1e-4)


def test_bf16_drafter_keeps_exactness():
    """A bfloat16 drafter proposes slightly different tokens; exact GAD with it
    still equals fp32 greedy of the verifier."""
    task = make_task()
    d = task.target_dictionary
    ar = make_model(task, seed=40)
    dr = make_model(task, arch="block_nat", seed=41, **DRAFTERS[1]).to(torch.bfloat16)
    rows = random_rows(d, 8, 1, 30, seed=42)
    sample = make_sample(rows, d.pad())
    ref = greedy(ar, d, sample, max_len_b=40)
    for fast in (True, False):
        out, gen = aggressive(ar, task, sample, drafter=NARBlockDrafter(dr, d, 5, fast=fast), max_len_b=40)
        cmp = compare(ar, sample, ref, out)
        assert cmp.ok() and cmp.identical == 8, cmp
