"""Blockwise parallel decoding on random-weight transformer_blockwise models:
exact mode equals greedy whatever the heads propose (the top-K and min-block
rules on crafted scores: test_acceptance.py); merged predict/verify (one invocation per iteration); the
native engine's heads and its whole loop (fa_decode, the blockwise drafter) against the generator's; errors."""
import argparse
import random

import pytest
import torch

from helpers import (NATIVE_REASON, aggressive, compare, fast_first, greedy, make_model, make_sample, make_task,
                     needs_native, random_rows)
from fairseq_aggressive.acceptance import build_blockwise_acceptance
from fairseq_aggressive.drafters import BlockwiseHeadsDrafter, DrafterCaps


SHAPES = [
    dict(blockwise_k=2),
    dict(blockwise_k=4, decoder_layers=3, decoder_normalize_before=True, share_all_embeddings=True),
    dict(blockwise_k=8, decoder_learned_pos=True, blockwise_ffn_dim=16),
]


@pytest.mark.parametrize("si,engine", fast_first([(1, "native"), (0, "torch"), (1, "torch"), (2, "torch"),
                                                   (0, "native"), (2, "native")]))
def test_exact_blockwise_equals_greedy_random_heads(si, engine):
    if engine == "native" and NATIVE_REASON is not None:
        pytest.skip(f"no native engine here: {NATIVE_REASON}")
    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=si, **SHAPES[si])
    cmp = None
    for bsz, (lo, hi) in ((1, (1, 10)), (8, (1, 40)), (8, (15, 60))):
        rows = random_rows(d, bsz, lo, hi, seed=100 * si + hi)
        sample = make_sample(rows, d.pad())
        for opts in (dict(max_len_b=50), dict(max_len_a=1.0, max_len_b=2, min_len=3)):
            ref = greedy(m, d, sample, **opts)
            out, gen = aggressive(m, task, sample, drafter=BlockwiseHeadsDrafter(m, d), engine=engine, **opts)
            assert (gen.native is not None) == (engine == "native")
            cmp = compare(m, sample, ref, out, cmp)
            assert gen.stats.drafted > 0
    assert cmp.ok(), cmp


class OracleHeads(BlockwiseHeadsDrafter):
    """Proposals = the verifier's true greedy continuation (full forwards), with
    every ``wrong_every``-th token corrupted: long accepted runs through the
    merged predict/verify path."""

    def __init__(self, model, d, sample, wrong_every=0):
        super().__init__(model, d)
        self.d, self.sample, self.wrong_every, self.n = d, sample, wrong_every, 0
        self.outputs = None

    def begin(self, sample, max_len, encoder_out=None):
        super().begin(sample, max_len, encoder_out)
        self.enc = self.model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])

    def update(self, sent, output, outcome):
        # propose k-1 greedy tokens after the output (what ideal heads would do)
        enc = self.model.encoder.reorder_encoder_out(self.enc, torch.tensor([sent]))
        cont = []
        with torch.no_grad():
            for _ in range(self.model.blockwise_k - 1):
                prev = torch.tensor([[self.d.eos()] + output + cont])
                lp = self.model.decoder(prev, encoder_out=enc)[0][0, -1]
                lp[self.d.pad()] = -1e9
                t = int(lp.argmax())
                self.n += 1
                if self.wrong_every and self.n % self.wrong_every == 0:
                    t = self.d.nspecial + (t + 1 - self.d.nspecial) % (len(self.d) - self.d.nspecial)
                cont.append(t)
        self.proposals[sent] = cont


@pytest.mark.parametrize("wrong_every", fast_first([4, 0]))
def test_exact_blockwise_long_accepted_blocks(wrong_every):
    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=5, blockwise_k=6)
    rows = random_rows(d, 8, 2, 30, seed=7)
    sample = make_sample(rows, d.pad())
    ref = greedy(m, d, sample, max_len_b=40)
    drafter = OracleHeads(m, d, sample, wrong_every)
    drafter.caps = DrafterCaps()  # proposals come from update() here, not from the pass's features
    out, gen = aggressive(m, task, sample, drafter=drafter, max_len_b=40)
    cmp = compare(m, sample, ref, out)
    assert cmp.ok(), cmp
    if wrong_every == 0:
        assert gen.stats.as_dict()["mean_tokens_per_pass"] > 4.5  # k=6: up to 6 per pass


def test_merged_predict_verify_one_invocation_per_iteration():
    """The proposals of pass n+1 come from pass n's features: per iteration one
    verifier pass and one application of the heads to features it already has,
    no separate prediction run of the model; every pass after the first drafts
    k-1 tokens (until the length cap)."""
    from fairseq_aggressive.generator import build_generator

    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=2, blockwise_k=4)
    rows = random_rows(d, 1, 10, 20, seed=3)
    sample = make_sample(rows, d.pad())
    gen = build_generator([m], d, BlockwiseHeadsDrafter(m, d), engine="torch", max_len_b=30)
    calls = {"decoder.forward": 0, "verifier": 0, "heads": 0, "encoder": 0}

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    m.decoder.forward = counted("decoder.forward", m.decoder.forward)
    m.encoder.forward = counted("encoder", m.encoder.forward)
    m.head_logits = counted("heads", m.head_logits)
    gen.verifier.decoder.forward = counted("verifier", gen.verifier.decoder.forward)
    out = gen.generate([m], sample)
    passes = gen.stats.passes
    assert calls == {"decoder.forward": 0, "verifier": passes, "heads": passes, "encoder": 1}, calls
    n_tok = len(out[0][0]["tokens"])
    # the first pass drafts nothing, later ones k-1 = 3 tokens (the length cap may cut the last)
    assert 3 * (passes - 1) - 3 <= gen.stats.drafted <= 3 * (passes - 1)
    assert 1 < passes < n_tok  # blocks were accepted


@needs_native
def test_blockwise_on_the_native_verifier_one_pass_and_one_heads_call_per_iteration(monkeypatch):
    """The generator's loop on the native verifier: the heads read the engine's
    features of the last emitted token, one engine pass and one heads call per
    iteration, blocks accepted, greedy's output."""
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.native import NativeBatch

    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=2, blockwise_k=4)
    sample = make_sample(random_rows(d, 3, 10, 20, seed=3), d.pad())
    steps, heads = [], []
    real = NativeBatch.step
    monkeypatch.setattr(NativeBatch, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    real_heads = m.head_logits
    m.head_logits = lambda x: heads.append(x.shape[0]) or real_heads(x)
    gen = build_generator([m], d, BlockwiseHeadsDrafter(m, d), engine="native", engine_loop=False, max_len_b=30)
    out = gen.generate([m], sample)
    assert compare(m, sample, greedy(m, d, sample, max_len_b=30), out).identical == 3
    assert len(steps) == len(heads) == gen.stats.passes and gen.stats.drafted > 0
    assert gen.stats.sentence_passes < sum(len(o[0]["tokens"]) for o in out)  # blocks were accepted


@needs_native
@pytest.mark.parametrize("si", fast_first([1, 2, 0]))
def test_engine_heads_propose_what_torch_heads_do(si):
    from fairseq_aggressive.native import NativeEngine

    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=si, **SHAPES[si])
    engine = NativeEngine(m, d)
    assert engine.n_heads == m.blockwise_k - 1
    batch = engine.begin(make_sample(random_rows(d, 6, 3, 9, seed=si), d.pad())["net_input"]["src_tokens"], 20)
    feats = torch.randn(6, m.decoder.embed_dim, generator=torch.Generator().manual_seed(si))
    with torch.no_grad():
        logits = m.head_logits(feats)
    logits[..., d.pad()] = -float("inf")
    assert batch.heads(list(range(6)), feats) == logits.argmax(-1).tolist()
    plain = NativeEngine(make_model(task, seed=si), d).begin(torch.tensor([[5, 6, d.eos()]]), 20)
    with pytest.raises(ValueError, match="no proposal heads"):
        plain.heads([0], feats[:1])


def _blockwise_runs(m, d, engine_loop, kw):
    from fairseq_aggressive.generator import build_generator

    gen = build_generator([m], d, BlockwiseHeadsDrafter(m, d), engine="native", engine_loop=engine_loop, **kw)
    gen.verifier.lanes = 1  # each batch whole: its passes counted as the generator's loop counts them
    outs, passes = [], []
    for bsz, (lo, hi), seed in ((1, (1, 12), 4), (8, (1, 40), 5), (8, (15, 50), 6)):
        outs += gen.generate([m], make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad()))
        passes += list(gen.last_sentence_passes)
    return outs, passes, gen.stats


@needs_native
@pytest.mark.parametrize("kw", fast_first([dict(max_len_b=50), dict(max_len_b=50, max_draft_len=2),
                                           dict(max_len_a=1.0, max_len_b=2, min_len=3),
                                           dict(unk_penalty=-1.5, temperature=0.7, max_len_b=50)]),
                         ids=["plain", "cap2", "max-len", "unkpen-temperature"])
def test_engine_loop_equals_the_generators_loop(kw, monkeypatch):
    """fa_decode with the blockwise drafter: one call per batch, the tokens, scores, passes and
    counters of the generator's loop on the native verifier, greedy's output."""
    from fairseq_aggressive.native import NativeBatch
    from test_copy_loop import _bits, _counters

    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=5, blockwise_k=6, decoder_layers=3)
    steps = []
    real = NativeBatch.step
    monkeypatch.setattr(NativeBatch, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    a = _blockwise_runs(m, d, True, kw)
    assert not steps
    b = _blockwise_runs(m, d, False, kw)
    assert steps
    assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and _counters(a[2]) == _counters(b[2])
    assert a[2].drafted > a[2].accepted > 0
    greedy_kw = {k: v for k, v in kw.items() if k != "max_draft_len"}
    cmp, o = None, 0
    for bsz, (lo, hi), seed in ((1, (1, 12), 4), (8, (1, 40), 5), (8, (15, 50), 6)):
        sample = make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad())
        cmp = compare(m, sample, greedy(m, d, sample, **greedy_kw), a[0][o: o + bsz], cmp)
        o += bsz
    assert cmp.ok() and cmp.identical == cmp.total == 17, cmp


def test_blockwise_beam_decoding_is_base_model():
    """Decoded with fairseq's generator, a blockwise model behaves as its base."""
    task = make_task()
    d = task.target_dictionary
    m = make_model(task, arch="transformer_blockwise", seed=9, blockwise_k=3)
    base = make_model(task, arch="transformer", seed=9)
    base.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("blockwise_heads.")})
    sample = make_sample(random_rows(d, 4, 3, 20, seed=1), d.pad())
    a, b = greedy(m, d, sample), greedy(base, d, sample)
    assert [h[0]["tokens"].tolist() for h in a] == [h[0]["tokens"].tolist() for h in b]


def test_blockwise_errors():
    task = make_task()
    d = task.target_dictionary
    plain = make_model(task)
    with pytest.raises(ValueError, match="proposal heads"):
        BlockwiseHeadsDrafter(plain, d)
    with pytest.raises(ValueError, match="--blockwise-k"):
        make_model(task, arch="transformer_blockwise", blockwise_k=1)
    with pytest.raises(ValueError, match="--min-block-size"):
        build_blockwise_acceptance(1, 5, block_size=4)
    with pytest.raises(ValueError, match="--min-block-size"):
        build_blockwise_acceptance(1, 0)
    with pytest.raises(ValueError, match="--blockwise-topk"):
        build_blockwise_acceptance(0, 1)
    with pytest.raises(ValueError, match="--blockwise-topk"):
        make_task(blockwise_topk=0)
    t = make_task(decoding="blockwise", min_block_size=5)
    with pytest.raises(ValueError, match="larger than the block size"):
        t.build_generator([make_model(t, arch="transformer_blockwise", blockwise_k=4)], argparse.Namespace(beam=1))
    t = make_task(decoding="blockwise")
    with pytest.raises(ValueError, match="proposal heads"):
        t.build_generator([plain], argparse.Namespace(beam=1))


# ---------------------------------------------------------------- the criterion
def criterion_sample(d, seed=4):
    """A training sample: right-padded targets and their shifted decoder inputs."""
    tgt_rows = random_rows(d, 5, 3, 12, seed=seed)
    sample = make_sample(random_rows(d, 5, 3, 12, seed=seed + 1), d.pad())
    target = make_sample(tgt_rows, d.pad(), left_pad=False)["net_input"]["src_tokens"]
    prev = torch.full_like(target, d.pad())
    for i, r in enumerate(tgt_rows):
        prev[i, : len(r)] = torch.tensor([d.eos()] + r[:-1])
    sample["target"], sample["net_input"]["prev_output_tokens"] = target, prev
    sample["ntokens"] = int(target.ne(d.pad()).sum())
    return sample


def per_head_losses(model, crit, sample):
    """Each head's mean label-smoothed loss computed directly from the model's outputs."""
    target, pad, T = sample["target"], crit.padding_idx, sample["target"].size(1)
    enc = model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    feats, _ = model.decoder(sample["net_input"]["prev_output_tokens"], encoder_out=enc, features_only=True)
    logits = [model.decoder.output_layer(feats)] + list(model.head_logits(feats).unbind(2))
    shifted = torch.cat([target, target.new_full((target.size(0), len(logits)), pad)], 1)
    out = []
    for h, lg in enumerate(logits):
        tgt = shifted[:, h : h + T]
        keep = tgt.ne(pad)
        loss, _ = crit_loss(lg[keep].log_softmax(-1), tgt[keep], crit.eps)
        out.append(loss / keep.sum())
    return out


def crit_loss(lprobs, tgt, eps):
    nll = -lprobs.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    eps_i = eps / (lprobs.size(-1) - 1)
    return ((1.0 - eps - eps_i) * nll + eps_i * smooth).sum(), nll.sum()


@pytest.mark.parametrize("freeze", [False, True])
def test_blockwise_criterion_mean_and_sampled(freeze):
    """mean = average of the k heads' losses; sampled = one head's loss, each head drawn;
    a frozen base gets no gradient and head 1 is not in its training loss."""
    from fairseq_aggressive.criterions.blockwise_cross_entropy import BlockwiseCrossEntropy

    task = make_task()
    d = task.target_dictionary
    k = 3
    model = make_model(task, arch="transformer_blockwise", seed=5, blockwise_k=k, freeze_base=freeze)
    sample = criterion_sample(d)
    n_tok = sample["ntokens"]
    heads = [float(x) for x in per_head_losses(model, BlockwiseCrossEntropy(task, 0.1, "mean"), sample)]

    model.train()
    mean = BlockwiseCrossEntropy(task, 0.1, "mean")
    loss, size, log = mean(model, sample)
    trained = heads[1:] if freeze else heads
    assert size == n_tok
    assert float(loss) / n_tok == pytest.approx(sum(trained) / len(trained), rel=1e-4)
    assert log["loss"] / n_tok == pytest.approx(sum(heads) / k, rel=1e-4)  # logged: all heads
    loss.backward()
    base_grads = [p.grad for n, p in model.named_parameters() if not n.startswith("blockwise_heads.")]
    head_grads = [p.grad for n, p in model.named_parameters() if n.startswith("blockwise_heads.")]
    assert all(g is not None and g.abs().sum() > 0 for g in head_grads)
    if freeze:
        assert all(g is None for g in base_grads)
    else:
        assert any(g is not None and g.abs().sum() > 0 for g in base_grads)

    sampled = BlockwiseCrossEntropy(task, 0.1, "sampled")
    seen = set()
    random.seed(0)
    for _ in range(40):
        loss, _, _ = sampled(model, sample)
        value = float(loss) / n_tok
        match = [h for h in range(k) if value == pytest.approx(heads[h], rel=1e-4)]
        assert match, (value, heads)
        seen.add(match[0])
    assert seen == (set(range(1, k)) if freeze else set(range(k)))
    model.eval()  # validation: the mean over every head, whatever the mode
    loss, _, _ = sampled(model, sample)
    assert float(loss) / n_tok == pytest.approx(sum(heads) / k, rel=1e-4)


@pytest.mark.parametrize("freeze,base_weight", [(False, None), (True, None), (False, 0.5)])
def test_blockwise_criterion_per_position(freeze, base_weight):
    """per-position: the base's loss at every position plus one of heads 2..k drawn per position,
    (base + (k-1) x drawn) / k per token, W x base + (1 - W) x drawn with --blockwise-base-weight W
    (drawn only with a frozen base); each drawn head's
    accuracy counts the positions that drew it; validation reports the mean of every head."""
    from fairseq_aggressive.criterions.blockwise_cross_entropy import BlockwiseCrossEntropy

    task = make_task()
    d = task.target_dictionary
    k = 4
    model = make_model(task, arch="transformer_blockwise", seed=5, blockwise_k=k, freeze_base=freeze)
    sample = criterion_sample(d)
    target, pad, T = sample["target"], d.pad(), sample["target"].size(1)
    n_tok = sample["ntokens"]
    crit = BlockwiseCrossEntropy(task, 0.1, "per-position", base_weight)
    enc = model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
    feats, _ = model.decoder(sample["net_input"]["prev_output_tokens"], encoder_out=enc, features_only=True)
    lprobs = [model.decoder.output_layer(feats).log_softmax(-1)]
    lprobs += [lg.log_softmax(-1) for lg in model.head_logits(feats).unbind(2)]
    shifted = torch.cat([target, target.new_full((target.size(0), k), pad)], 1)

    model.train()
    for seed in range(3):
        torch.manual_seed(seed)
        drawn = torch.randint(1, k, target.shape)
        torch.manual_seed(seed)
        loss, size, log = crit(model, sample)
        total, nll_n, right = 0.0, 0, [0] * k
        for h in range(1, k):
            tgt = shifted[:, h : h + T]
            keep = tgt.ne(pad) & drawn.eq(h)
            part, _ = crit_loss(lprobs[h][keep], tgt[keep], crit.eps)
            total += float(part)
            nll_n += int(keep.sum())
            right[h] = int(lprobs[h][keep].argmax(-1).eq(tgt[keep]).sum())
            assert log[f"head{h + 1}_n"] == int(keep.sum()) and log[f"head{h + 1}_correct"] == right[h]
        drawn_mean = total / nll_n
        base_keep = target.ne(pad)
        base_mean = float(crit_loss(lprobs[0][base_keep], target[base_keep], crit.eps)[0]) / n_tok
        w = 1 / k if base_weight is None else base_weight
        want = drawn_mean if freeze else w * base_mean + (1 - w) * drawn_mean
        assert size == n_tok
        assert float(loss) / n_tok == pytest.approx(want, rel=1e-4)
        assert ("head1_n" in log) == (not freeze)
    loss.backward()
    base_grads = [p.grad for n, p in model.named_parameters() if not n.startswith("blockwise_heads.")]
    assert all(p.grad is not None for p in model.blockwise_heads.parameters())
    if freeze:
        assert all(g is None for g in base_grads)
    else:
        assert any(g is not None and g.abs().sum() > 0 for g in base_grads)
    model.eval()
    heads = [float(x) for x in per_head_losses(model, crit, sample)]
    loss, _, _ = crit(model, sample)
    assert float(loss) / n_tok == pytest.approx(sum(heads) / k, rel=1e-4)


def test_blockwise_base_weight_refusals():
    from fairseq_aggressive.criterions.blockwise_cross_entropy import BlockwiseCrossEntropy

    task = make_task()
    with pytest.raises(ValueError, match="per-position, not of mean"):
        BlockwiseCrossEntropy(task, 0.1, "mean", 0.5)
    for w in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            BlockwiseCrossEntropy(task, 0.1, "per-position", w)
