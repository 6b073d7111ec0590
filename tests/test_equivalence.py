"""IAD (and the generator core) against fairseq's own greedy search."""
import random

import pytest
import torch

from fairseq_aggressive.drafters import Drafter, InputCopyDrafter, single_drafts
from fairseq_aggressive.generator import build_generator
from helpers import (aggressive, compare, fast_first, greedy, greedy_rows, make_model, make_sample, make_task,
                     random_rows)

SHAPES = {
    "post-norm, sinusoidal": {},
    "pre-norm, learned positions": dict(
        encoder_normalize_before=True, decoder_normalize_before=True,
        encoder_learned_pos=True, decoder_learned_pos=True,
    ),
    "shared embeddings, layernorm-embedding, unscaled": dict(
        share_all_embeddings=True, layernorm_embedding=True, no_scale_embedding=True,
    ),
    "deep-shallow 3+1, output dim differs": dict(
        encoder_layers=3, decoder_layers=1, decoder_output_dim=24, share_decoder_input_output_embed=False,
    ),
    "normformer-style extras": dict(
        decoder_normalize_before=True, scale_attn=True, scale_fc=True, scale_heads=True, scale_resids=True,
    ),
    "no positions, relu, 2 heads": dict(
        no_token_positional_embeddings=True, activation_fn="relu",
        encoder_attention_heads=2, decoder_attention_heads=2,
    ),
}


def random_sources(rng, n, vocab, eos, max_src=30, repeat=False):
    rows = []
    for _ in range(n):
        length = rng.choice([0, 1, 2] + list(range(3, max_src)))
        if repeat and length >= 4:  # repeated n-grams make suffix matching ambiguous
            unit = [rng.randrange(4, vocab) for _ in range(rng.randrange(1, 4))]
            row = (unit * length)[:length]
        else:
            row = [rng.randrange(4, vocab) for _ in range(length)]
        rows.append(row + [eos])
    return rows


def batches(rows, bsz):
    for i in range(0, len(rows), bsz):
        yield rows[i : i + bsz]


# fairseq's greedy outputs by (the model's name, the generation options, the batch's rows): the
# tests that decode one model's rows in several ways compute the reference once
_REFS = {}


def check(model, task, rows, bsz, gen_kw=None, drafter_factory=None, agg_kw=None, model_name=None):
    """Greedy (stock) vs aggressive on ``rows`` in batches of ``bsz``;
    ``agg_kw`` are options of the aggressive generator only.  ``model_name``: a name
    that only this model (its shape and seed) has, under which the references are kept."""
    d = task.target_dictionary
    gen_kw = gen_kw or {}
    cmp, accepted = None, 0
    opts = tuple(sorted(gen_kw.items()))
    each = None  # every row's reference from batches of 8 (greedy_rows) where batch 1 is compared
    if bsz == 1 and not gen_kw.get("max_len_a"):
        key = (model_name, opts, "rows", tuple(map(tuple, rows)))
        each = _REFS.get(key) if model_name is not None else None
        if each is None:
            each = greedy_rows(model, d, rows, **gen_kw)
            if model_name is not None:
                _REFS[key] = each
    for n, chunk in enumerate(batches(rows, bsz)):
        sample = make_sample(chunk, d.pad())
        key = (model_name, opts, tuple(map(tuple, chunk)))
        ref = each[n : n + 1] if each is not None else _REFS.get(key) if model_name is not None else None
        if ref is None:
            ref = greedy(model, d, sample, **gen_kw)
            if model_name is not None:
                _REFS[key] = ref
        drafter = drafter_factory(ref) if drafter_factory else None
        out, gen = aggressive(model, task, sample, drafter=drafter, **gen_kw, **(agg_kw or {}))
        cmp = compare(model, sample, ref, out, cmp)
        accepted += gen.stats.accepted
    assert cmp.ok(), cmp
    cmp.accepted = accepted  # drafted tokens accepted over all batches
    return cmp


@pytest.mark.slow  # a minute or more each on 2 busy cores
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("bsz", [1, 8])
@pytest.mark.parametrize("engine", ["auto", "torch"])  # auto: the native engine where it runs
def test_iad_matches_greedy_random_models(shape, bsz, engine):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=len(shape), **SHAPES[shape])
    if engine == "torch" and build_generator([model], d, InputCopyDrafter(d, d)).native is None:
        pytest.skip("the default engine verifies this shape on torch: the auto case decodes it so")
    rng = random.Random(hash((shape, bsz)) % 1000)
    rows = random_sources(rng, 48, len(d), d.eos()) + random_sources(rng, 24, len(d), d.eos(), repeat=True)
    cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=40), agg_kw=dict(engine=engine), model_name=shape)
    assert cmp.identical + cmp.near_ties == len(rows)


@pytest.mark.parametrize(
    "gen_kw",
    fast_first([
        dict(max_len_a=0, max_len_b=3),  # max length hit: forced EOS
        dict(max_len_a=1.0, max_len_b=2),  # length depends on the padded batch
        dict(min_len=5, max_len_b=30),
        dict(unk_penalty=-3.0, max_len_b=30),  # negative penalty: unk gets chosen
        dict(len_penalty=0.5, temperature=0.7, max_len_b=30),
        dict(normalize_scores=False, max_len_b=30),
    ]),
    ids=["max-len", "max-len-a", "min-len", "unkpen", "lenpen-temperature", "unnormalized"],
)
def test_iad_honours_generation_options(gen_kw):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    rng = random.Random(7)
    rows = random_sources(rng, 40, len(d), d.eos())
    for bsz in (1, 8):
        # the default: the engine's draft-length budget where it runs; then every draft verified
        check(model, task, rows, bsz, gen_kw=gen_kw, model_name="seed 3")
        cmp = check(model, task, rows, bsz, gen_kw=gen_kw, agg_kw=dict(draft_cost="off"), model_name="seed 3")
        assert cmp.accepted > 0, f"batch {bsz}: no drafted token was accepted"


@pytest.mark.slow
@pytest.mark.parametrize("lmax", [0, 1, 3])
def test_iad_max_draft_len(lmax):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=4)
    rows = random_sources(random.Random(lmax), 32, len(d), d.eos())
    for bsz in (1, 8):
        cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=30), agg_kw=dict(max_draft_len=lmax),
                    model_name="seed 4")
        assert lmax > 0 or cmp.accepted == 0, f"batch {bsz}: {cmp.accepted} drafted tokens accepted"
        # the drafts as made (not the engine's draft-length budget): Lmax 0: greedy steps only; otherwise
        # short drafts are accepted too
        cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=30),
                    agg_kw=dict(max_draft_len=lmax, draft_cost="off"), model_name="seed 4")
        assert (cmp.accepted > 0) == (lmax > 0), f"batch {bsz}: {cmp.accepted} drafted tokens accepted"


@pytest.mark.slow
def test_iad_long_inputs_hit_model_max_positions():
    """Sources of 60-120 tokens; the decoder's 48 positions bound the output
    (max_len = max_decoder_positions - 1), as in stock greedy."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=6, max_target_positions=48, decoder_learned_pos=True)
    rng = random.Random(5)
    rows = [[rng.randrange(4, len(d)) for _ in range(rng.randrange(60, 120))] + [d.eos()] for _ in range(16)]
    for bsz in (1, 8):
        cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=200))
    assert cmp.total == 16


class NoisyOracleDrafter(Drafter):
    """Drafts greedy's own continuation with random corruptions and random
    lengths: long accepted runs, rejections anywhere, ragged batches. Exactness
    must not depend on draft quality."""

    def __init__(self, ref, rng, p_corrupt, vocab):
        self.ref = [r[0]["tokens"].tolist() for r in ref]
        self.rng, self.p, self.vocab = rng, p_corrupt, vocab

    def begin(self, sample, max_len, encoder_out=None):
        pass

    def one(self, sent, output, cap):
        n = min(cap, self.rng.choice([0, 1, 2, 5, 40]))
        k = len(output)
        draft = self.ref[sent][k : k + n]
        return [self.rng.randrange(4, self.vocab) if self.rng.random() < self.p else t for t in draft]

    def propose(self, sents, outputs, caps):
        return single_drafts([self.one(s, o, c) for s, o, c in zip(sents, outputs, caps)])


@pytest.mark.slow  # minutes each on 2 busy cores
@pytest.mark.parametrize("p_corrupt,engine", [(0.0, "auto"), (0.05, "auto"), (0.3, "auto"),
                                              (0.05, "torch"), (0.3, "torch")])
@pytest.mark.parametrize("bsz", [1, 8])
def test_core_with_noisy_oracle_drafts(p_corrupt, engine, bsz):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=11, decoder_layers=3)
    rows = random_sources(random.Random(bsz), 64, len(d), d.eos())  # (one reference for every setting)
    rng = random.Random(int(p_corrupt * 100) + bsz)
    factory = lambda ref: NoisyOracleDrafter(ref, rng, p_corrupt, len(d))  # noqa: E731
    cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=50), drafter_factory=factory,
                agg_kw=dict(engine=engine), model_name="seed 11, 3 decoder layers")
    assert cmp.accepted > 0  # long accepted runs were verified, not only single steps


def test_iad_full_copy_finishes_in_one_pass():
    """A model whose greedy output equals its input is decoded in a single pass."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=5)
    rng = random.Random(1)
    rows = random_sources(rng, 8, len(d), d.eos(), max_src=20)
    sample = make_sample(rows, d.pad())
    ref = greedy(model, d, sample, max_len_b=40)

    copy_rows = [r[0]["tokens"].tolist() for r in ref]
    # decode with the draft taken from greedy's output (as if the source were it)
    from fairseq_aggressive.drafters import InputCopyDrafter

    class Copy(InputCopyDrafter):
        def begin(self, sample, max_len, encoder_out=None):
            super().begin(sample, max_len)
            self.src = [list(r) for r in copy_rows]

    out, gen = aggressive(model, task, sample, drafter=Copy(d, d), max_len_b=40, max_draft_len=1024)
    assert [o[0]["tokens"].tolist() for o in out] == copy_rows
    assert gen.stats.sentence_passes == len(rows)
    assert gen.stats.passes == 1


@pytest.mark.slow  # about a minute on 2 busy cores
def test_joined_and_separate_dictionaries():
    """IAD maps source ids to target ids when the dictionaries differ (the same words in
    another order here): decoding stays exact, and a source that spells greedy's output
    is drafted as that output in target ids, all of it accepted in one pass."""
    from fairseq.data import Dictionary

    from fairseq_aggressive.drafters import InputCopyDrafter
    from helpers import make_dict

    src = make_dict(30)
    tgt = Dictionary()
    for i in range(30):
        tgt.add_symbol(f"w{i}", n=i + 1)  # finalize() orders by count: w29 first
    tgt.finalize(padding_factor=1)
    assert tgt.symbols[tgt.nspecial] == "w29" and sorted(tgt.symbols) == sorted(src.symbols)
    task = make_task(src, tgt)
    model = make_model(task, seed=9)
    rng = random.Random(3)
    rows = random_sources(rng, 24, len(src), src.eos())
    check(model, task, rows, 8, gen_kw=dict(max_len_b=30))

    sample = make_sample(rows[:8], src.pad())
    greedy_rows = [r[0]["tokens"].tolist() for r in greedy(model, tgt, sample, max_len_b=30)]
    spelled = make_sample([[src.index(tgt[t]) for t in row] for row in greedy_rows], src.pad())

    class CopyOfSpelled(InputCopyDrafter):
        """Drafts from ``spelled`` (source ids) while the model decodes ``sample``."""

        def begin(self, sample, *args, **kwargs):
            super().begin(spelled, *args, **kwargs)

    out, gen = aggressive(model, task, sample, drafter=CopyOfSpelled(src, tgt), max_len_b=30,
                          max_draft_len=1024)
    assert [o[0]["tokens"].tolist() for o in out] == greedy_rows
    # one pass: every token was drafted and accepted (all but the last, which the pass may add itself)
    assert gen.stats.passes == 1, gen.stats.summary()
    assert gen.stats.accepted >= sum(len(r) - 1 for r in greedy_rows), gen.stats.summary()


def test_attention_backends_leave_out_cudnn_for_half_precision_on_cuda():
    """Decoding passes change attention shapes every call: cuDNN's attention (a plan per shape)
    is left out on CUDA in float16/bfloat16; elsewhere torch chooses."""
    from torch.nn.attention import SDPBackend

    from fairseq_aggressive.runtime.layer_ops import attention_backends

    assert attention_backends(torch.device("cpu"), torch.float16) is None
    assert attention_backends(torch.device("cuda"), torch.float32) is None
    for dtype in (torch.float16, torch.bfloat16):
        chosen = attention_backends(torch.device("cuda"), dtype)
        assert SDPBackend.CUDNN_ATTENTION not in chosen and SDPBackend.EFFICIENT_ATTENTION in chosen


def test_verifier_held_to_one_attention_backend_gives_greedy():
    """The verifier's attention held to one backend (the math kernel) decodes greedy's output."""
    from torch.nn.attention import SDPBackend

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1)
    rows = random_rows(d, 8, 1, 20, seed=4)
    rows = [r[:-1] + r[: len(r) // 2] + [d.eos()] for r in rows]
    sample = make_sample(rows, d.pad())
    ref = greedy(model, d, sample, max_len_b=30)
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine="torch", max_len_b=30)
    gen.verifier.decoder.attention_backends = [SDPBackend.MATH]
    out = gen.generate([model], sample)
    assert [h[0]["tokens"].tolist() for h in out] == [h[0]["tokens"].tolist() for h in ref]
    assert gen.stats.drafted > 0  # passes over several positions ran
