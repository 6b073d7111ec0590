"""Beam search on the native engine against fairseq's own SequenceGenerator
on the same checkpoint: every hypothesis of every sentence (tokens, order,
score, positional scores; a sentence whose output torch itself changes with
the batch it is decoded in counts as a near tie, see _check), random models of each shape the engine takes and
the shipped 9+3, batch 1 and 8, beam 1, 2, 4, 5, with --lenpen, --unkpen,
--min-len, --max-len-b, --temperature, --unnormalized and
--no-repeat-ngram-size; int8 against the int8 model's beam on the torch path."""
import copy
import random

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_aggressive.native.beam import NativeBeamGenerator
from fairseq_aggressive.native import NativeEngine, NativeUnavailable
from helpers import fast_first, make_model, make_sample, make_task, needs_native, sample_lines
from test_equivalence import SHAPES, batches, random_sources

pytestmark = needs_native

SCORE_TOL = 1e-4  # float32 sums in another order (the engine's products are not torch's)

OPTIONS = [
    dict(),
    dict(len_penalty=0.6),
    dict(len_penalty=1.4, unk_penalty=0.7, min_len=4),
    dict(max_len_b=6),  # most hypotheses end at the length limit
    dict(temperature=0.7),
    dict(normalize_scores=False),
]


def _pair(model, d, beam, threads=1, **kw):
    """fairseq's generator and the engine's, with the same settings (random
    models rarely end a sentence: 40 tokens at most unless told)."""
    kw.setdefault("max_len_b", 40)
    ref = SequenceGenerator([model], d, beam_size=beam, **kw)
    native = NativeBeamGenerator(NativeEngine(model, d, threads=threads), d, ref, beam_size=beam, **kw)
    return ref, native


def _hyps(out):
    return [[h["tokens"].tolist() for h in sent] for sent in out]


def _check(model, d, ref, native, rows, bsz, max_ties=0.1):
    """The engine's hypotheses equal fairseq's for every sentence of ``rows``
    decoded in batches of ``bsz``, except near ties: where they differ, fairseq
    decoding the sentence in another batch (alone, or padded beside a long
    one) must give the engine's, i.e. torch's own arithmetic flips that choice;
    at most ``max_ties`` of the sentences."""
    ties = 0
    for chunk in batches(rows, bsz):
        sample = make_sample(chunk, d.pad())
        want, got = ref.generate([model], sample), native.generate([model], sample)
        assert len(want) == len(got)
        for i, (w, g) in enumerate(zip(want, got)):
            if _hyps([g]) != _hyps([w]):
                other = [chunk[i]] if len(chunk) > 1 else [chunk[i], [5] * (len(chunk[i]) + 7) + [d.eos()]]
                alone = ref.generate([model], make_sample(other, d.pad()))[0]
                assert _hyps([alone]) == _hyps([g]), f"sentence {chunk[i]}: {_hyps([w])[0][:2]} != {_hyps([g])[0][:2]}"
                ties += 1
                w = alone
            for a, b in zip(w, g):
                assert abs(float(a["score"]) - float(b["score"])) < SCORE_TOL
                assert torch.allclose(a["positional_scores"], b["positional_scores"], atol=SCORE_TOL)
    assert ties <= max(1, max_ties * len(rows)), f"{ties} of {len(rows)} sentences differ (near ties in torch)"
    return ties


def _engine_takes(model, d):
    try:
        NativeEngine(model, d, threads=1)
    except NativeUnavailable as e:
        pytest.skip(f"the engine does not take this shape: {e}")


SETTINGS = [(1, 1), (2, 8), (5, 1), (4, 8)]
# the fast tier: every shape at beam 2 in batches of 8 and every setting on a shape the engine takes
EVERY_SETTING = "pre-norm, learned positions"
assert EVERY_SETTING in SHAPES
CASES = [(b, n, s) if s == EVERY_SETTING or (b, n) == (2, 8)
         else pytest.param(b, n, s, marks=pytest.mark.slow)
         for s in sorted(SHAPES) for (b, n) in SETTINGS]


@pytest.mark.parametrize("beam, bsz, shape", CASES)
def test_beam_matches_fairseq_random_models(shape, beam, bsz):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3, **SHAPES[shape])
    _engine_takes(model, d)
    ref, native = _pair(model, d, beam)
    rows = random_sources(random.Random(beam * 10 + bsz), 16, len(d), d.eos())
    _check(model, d, ref, native, rows, bsz)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
@pytest.mark.parametrize("beam", fast_first([2, 5]))
def test_beam_options(options, beam):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=11)
    ref, native = _pair(model, d, beam, **options)
    rows = random_sources(random.Random(7), 16, len(d), d.eos())
    _check(model, d, ref, native, rows, 8)
    _check(model, d, ref, native, rows[:4], 1)


def _cuda_semantics_no_repeat(blocker, tokens, lprobs, bsz, beam_size, step):
    """fairseq's n-gram blocking as its CUDA kernel does it: over the hypothesis
    so far (its CPU fallback reads the buffer's padded tail and blocks nothing)."""
    return type(blocker)._no_repeat_ngram(blocker, tokens[:, : step + 1], lprobs, bsz, beam_size, step)


@pytest.mark.parametrize("n", [2, 3])
def test_no_repeat_ngram(monkeypatch, n):
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=5)
    ref, native = _pair(model, d, 4, no_repeat_ngram_size=n)
    rows = random_sources(random.Random(n), 12, len(d), d.eos(), repeat=True)
    # fairseq's CPU fallback blocks nothing: the engine's output differs from it somewhere
    cpu_fairseq = [h[0]["tokens"].tolist() for c in batches(rows, 6)
                   for h in ref.generate([model], make_sample(c, d.pad()))]
    ours = [h[0]["tokens"].tolist() for c in batches(rows, 6)
            for h in native.generate([model], make_sample(c, d.pad()))]
    assert cpu_fairseq != ours
    monkeypatch.setattr(NGramRepeatBlock, "forward",
                        lambda self, tokens, lprobs, bsz, beam_size, step:
                        _cuda_semantics_no_repeat(self, tokens, lprobs, bsz, beam_size, step))
    _check(model, d, ref, native, rows, 6)
    for hyps in (native.generate([model], make_sample(c, d.pad())) for c in batches(rows, 6)):
        for h in hyps:
            t = [d.eos()] + h[0]["tokens"].tolist()[:-1]
            grams = [tuple(t[i:i + n]) for i in range(len(t) - n + 1)]
            assert len(grams) == len(set(grams))


def test_int8_matches_the_int8_model():
    from fairseq_aggressive.runtime.quantization import quantize_int8

    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=9, encoder_attention_heads=2, decoder_attention_heads=2))
    ref, native = _pair(model, d, 4)
    rows = random_sources(random.Random(9), 16, len(d), d.eos())
    _check(model, d, ref, native, rows, 8)


def test_shipped_gec_model():
    from fairseq_aggressive.translator import load_hub

    hub = load_hub("models/uagec-9x3")
    model, d = hub.models[0], hub.tgt_dict
    rows = [hub.encode(s).tolist() for s in sample_lines(24)]
    ref, native = _pair(model, d, 5, threads=2, max_len_a=1.2, max_len_b=10)
    _check(model, d, ref, native, rows, 8)
    _check(model, d, ref, native, rows[:6], 1)


def test_shipped_model_gives_the_same_beams_on_any_thread_count():
    """The candidates' scans are shared among the engine's threads row by row (8,424 columns per
    row: enough work to split): 1, 2, 3 and 8 threads (more than this machine's cores) give the
    same hypotheses, scores and positional scores, bit for bit, batch 8 and batch 1."""
    from fairseq_aggressive.translator import load_hub

    hub = load_hub("models/uagec-9x3")
    model, d = hub.models[0], hub.tgt_dict
    rows = [hub.encode(s).tolist() for s in sample_lines(16)]
    ref = SequenceGenerator([model], d, beam_size=5, max_len_a=1.2, max_len_b=10)
    outs = []
    for threads in (1, 2, 3, 8):
        native = NativeBeamGenerator(NativeEngine(model, d, threads=threads), d, ref, beam_size=5, max_len_a=1.2,
                                     max_len_b=10)
        out = []
        for chunk in list(batches(rows, 8)) + [[rows[0]]]:
            for sent in native.generate([model], make_sample(chunk, d.pad())):
                out.append([(h["tokens"].tolist(), h["score"].item(), h["positional_scores"].tolist())
                            for h in sent])
        outs.append(out)
    assert all(o == outs[0] for o in outs[1:])


def test_refusals():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1)
    engine = NativeEngine(model, d, threads=1)
    ref = SequenceGenerator([model], d, beam_size=2)
    with pytest.raises(ValueError, match="twice the beam must fit the vocabulary"):
        NativeBeamGenerator(engine, d, ref, beam_size=len(d))
    with pytest.raises(ValueError, match="--beam must be >= 1"):
        NativeBeamGenerator(engine, d, ref, beam_size=0)
    batch = engine.begin(make_sample([[5, 6, d.eos()]], d.pad())["net_input"]["src_tokens"], 0)
    with pytest.raises(ValueError, match="does not fit"):
        batch.decode_beam(2, 3, d.eos(), 10, 1, 0.0, 1.0)  # nbest > beam
    with pytest.raises(ValueError, match="does not fit"):
        batch.decode_beam(2, 2, len(d), 10, 1, 0.0, 1.0)  # a first token beyond the vocabulary
    with pytest.raises(ValueError, match="does not fit"):
        batch.decode_beam(2, 2, d.eos(), engine.tgt_positions, 1, 0.0, 1.0)  # beyond the position table
    # the batch is untouched by a refusal and decodes after it; beam search keeps
    # its hypotheses apart from the batch's caches, so a second search gives the same
    def search():
        return [[(h["tokens"].tolist(), h["score"]) for h in s] for s in batch.decode_beam(2, 2, d.eos(), 10, 1, 0.0, 1.0)[0]]

    first = search()
    assert len(first[0]) == 2 and search() == first


def test_long_batch_falls_back_to_fairseq():
    """A batch beyond the engine's position tables is decoded by fairseq's own generator."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=2, max_source_positions=64, max_target_positions=64)
    ref, native = _pair(model, d, 2, max_len_b=200)  # max_len 63: the engine's tables hold 64 positions
    rows = random_sources(random.Random(4), 4, len(d), d.eos())
    _check(model, d, ref, native, rows, 4)
    calls = []
    native.fallback = copy.copy(ref)
    native.fallback.generate = lambda *a, **k: calls.append(1) or ref.generate(*a, **k)
    native.engine.can_decode = lambda src_len, max_len: False
    _check(model, d, ref, native, rows, 4)
    assert calls


def test_hub_translate_with_the_engine():
    """A hub model's translate(beam=N, engine="native"): fairseq's beam output."""
    from fairseq_aggressive.translator import load_hub

    hub = load_hub("models/uagec-9x3")
    lines = sample_lines(8)
    assert hub.translate(lines, beam=4, engine="native") == hub.translate(lines, beam=4)
    with pytest.raises(ValueError, match="decodes plain beam search, not SequenceGenerator with Sampling"):
        hub.translate(lines[:1], beam=2, engine="native", sampling=True)
