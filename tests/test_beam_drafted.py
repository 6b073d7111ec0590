"""Drafted beam search in the engine (--decoding iad --beam N) against the
engine's plain beam search, which tests/test_beam_native.py holds to fairseq's:
every hypothesis of every sentence bit for bit (tokens, order, score,
positional scores), random models of every shape at beam 2, 4 and 5, batch 1
and 8, drafting the best hypothesis or all of them.  A random model rarely
copies its source, so the copy source handed to the search is an edited copy
of the model's own best output (the encoder still reads the sentence): drafts
are then mostly right and wrong at the edits, and every rule of the replay is
exercised (the tests count the steps drafts served).  Each
broken rule the test library can run (fa_set_beam_mutant) changes an output."""
import random

import numpy as np
import pytest
from fairseq.sequence_generator import SequenceGenerator

from fairseq_aggressive.native import NativeEngine, NativeUnavailable
from fairseq_aggressive.native.beam import CopyDrafts, NativeBeamGenerator
from helpers import make_model, make_sample, make_task, needs_native, sample_lines
from test_equivalence import SHAPES, batches, random_sources

pytestmark = needs_native

MAX_LEN = 30


def _padded(chunk, pad):
    return make_sample(chunk, pad)["net_input"]["src_tokens"]


def _decode(engine, d, chunk, beam, sources=None, max_draft=4, draft_hyps=1, **kw):
    """Every sentence's hypotheses as (tokens, score, positional scores) lists
    and the search's counts; drafted from ``sources`` (one token list per sentence) if given."""
    batch = engine.begin(_padded(chunk, d.pad()), 0)
    draft = {}
    if sources is not None:
        draft = dict(src=np.concatenate([np.array(s, dtype=np.int32) for s in sources]),
                     src_len=np.array([len(s) for s in sources], dtype=np.int32), max_draft=max_draft,
                     draft_hyps=draft_hyps)
    hyps, counts = batch.decode_beam(beam, beam, d.eos(), MAX_LEN, 1, kw.get("unk_penalty", 0.0),
                                     kw.get("temperature", 1.0), kw.get("len_penalty", 1.0), True, 0, **draft)
    out = [[(h["tokens"].tolist(), h["score"], h["positional_scores"].tolist()) for h in sent] for sent in hyps]
    return out, counts


def _edited(rng, tokens, vocab, eos):
    """A copy of ``tokens`` (EOS last) with a few deletions, insertions and replacements."""
    out = list(tokens[:-1])
    for _ in range(rng.randrange(0, 4)):
        kind, at = rng.randrange(3), rng.randrange(len(out) + 1)
        if kind == 0 and at < len(out):
            del out[at]
        elif kind == 1:
            out.insert(at, rng.randrange(4, vocab))
        elif at < len(out):
            out[at] = rng.randrange(4, vocab)
    return out + [eos]


def _sources(engine, d, rows, beam, seed):
    """Per sentence, an edited copy of its best plain beam hypothesis."""
    rng = random.Random(seed)
    out = []
    for chunk in batches(rows, 8):
        hyps, _ = _decode(engine, d, chunk, beam)
        out += [_edited(rng, h[0][0], len(d), d.eos()) for h in hyps]
    return out


def _compare(engine, d, rows, bsz, beam, sources, **kw):
    """Drafted equals plain for every sentence; the counts added up."""
    total = {}
    for s in range(0, len(rows), bsz):
        chunk, src = rows[s:s + bsz], sources[s:s + bsz]
        plain, _ = _decode(engine, d, chunk, beam, **{k: v for k, v in kw.items() if k not in ("max_draft", "draft_hyps")})
        drafted, counts = _decode(engine, d, chunk, beam, src, **kw)
        assert drafted == plain, f"sentences {s}..{s + len(chunk) - 1}: the drafted search differs"
        for name, _ in counts._fields_:
            total[name] = total.get(name, 0) + getattr(counts, name)
    return total


def _setup(seed, n, beam, model_seed=11, **shape):
    """A random model, its engine, n random sentences and their copy sources."""
    task = make_task()
    d = task.target_dictionary
    engine = _engine(make_model(task, seed=model_seed, **shape), d)
    rows = random_sources(random.Random(seed), n, len(d), d.eos())
    return d, engine, rows, _sources(engine, d, rows, beam, seed=seed)


def _engine(model, d, threads=1):
    try:
        return NativeEngine(model, d, threads=threads)
    except NativeUnavailable as e:
        pytest.skip(f"the engine does not take this shape: {e}")


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("beam, bsz, draft_hyps", [(2, 1, 2), (5, 1, 1), (4, 8, 4), (5, 8, 1)])
def test_drafted_equals_plain_beam_random_models(shape, beam, bsz, draft_hyps):
    d, engine, rows, sources = _setup(beam * 10 + bsz, 16, beam, model_seed=3, **SHAPES[shape])
    counts = _compare(engine, d, rows, bsz, beam, sources, max_draft=6, draft_hyps=draft_hyps)
    assert counts["drafted"] > 0


@pytest.mark.parametrize("options", [dict(len_penalty=0.6), dict(unk_penalty=-0.5), dict(temperature=0.7)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_drafted_with_options_and_draft_lengths(options):
    d, engine, rows, sources = _setup(5, 12, 4)
    for max_draft, draft_hyps in ((1, 4), (3, 1), (40, 2), (0, 4)):
        counts = _compare(engine, d, rows, 4, 4, sources, max_draft=max_draft, draft_hyps=draft_hyps, **options)
        assert (counts["drafted"] > 0) == (max_draft > 0)


def test_drafted_against_fairseq_and_int8():
    """The generator (--decoding iad --beam N's) against fairseq's SequenceGenerator,
    the model's own sources; and an int8 model's drafted search equals its plain one."""
    from fairseq_aggressive.runtime.quantization import quantize_int8
    from test_beam_native import _check

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=9)
    ref = SequenceGenerator([model], d, beam_size=5, max_len_b=MAX_LEN)

    def copy_source(sample):
        src = sample["net_input"]["src_tokens"]
        rows = [r[r.ne(d.pad())].numpy().astype(np.int32) for r in src]
        return np.concatenate(rows), np.array([len(r) for r in rows], dtype=np.int32)

    native = NativeBeamGenerator(_engine(model, d), d, ref, beam_size=5, max_len_b=MAX_LEN,
                                 drafts=CopyDrafts(copy_source, 4))
    rows = random_sources(random.Random(3), 16, len(d), d.eos())
    _check(model, d, ref, native, rows, 8)
    assert native.totals["steps"] > 0
    q = quantize_int8(make_model(task, seed=9, encoder_attention_heads=2, decoder_attention_heads=2))
    engine = _engine(q, d)
    rows = random_sources(random.Random(4), 12, len(d), d.eos())
    _compare(engine, d, rows, 4, 4, _sources(engine, d, rows, 4, seed=4), max_draft=5, draft_hyps=4)


@pytest.mark.parametrize("mutant", [1, 2, 3, 4])
def test_each_broken_rule_changes_an_output(monkeypatch, mutant):
    """The test above fails on every broken rule of the replay the test library
    runs: a child reads its parent's draft whatever its token (1), reads its
    parent's row again (2), a child off the draft keeps the draft's positions
    in its slot (3), the child on the draft leaves its parent's slot to the
    parent's first child (4).  Unbroken, the same library's search is exact."""
    from fairseq_aggressive.native import build, engine as native_engine

    monkeypatch.setattr(native_engine, "library", build.test_library)
    d, engine, rows, sources = _setup(8, 16, 4, model_seed=3)
    lib = build.test_library()
    counts = _compare(engine, d, rows, 1, 4, sources, max_draft=6, draft_hyps=4)
    assert counts["replayed"] > 0  # steps no pass served: the chains carried every hypothesis
    lib.fa_set_beam_mutant(mutant)
    try:
        with pytest.raises((AssertionError, RuntimeError)):
            _compare(engine, d, rows, 1, 4, sources, max_draft=6, draft_hyps=4)
    finally:
        lib.fa_set_beam_mutant(0)


def test_shipped_gec_model_drafted():
    """The 9+3 on UA-GEC sentences, its own sources: drafted beam 5 equals plain."""
    from fairseq_aggressive.translator import load_hub

    hub = load_hub("models/uagec-9x3")
    model, d = hub.models[0], hub.tgt_dict
    rows = [hub.encode(s).tolist() for s in sample_lines(16)]
    engine = _engine(model, d, threads=2)
    sources = [[d.index(hub.src_dict[t]) for t in row] for row in rows]  # the copy source in target ids
    counts = _compare(engine, d, rows, 1, 5, sources, max_draft=4, draft_hyps=5)
    assert counts["drafted"] > counts["reads"] // 4


def test_refusals():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    engine = _engine(model, d)
    rows = random_sources(random.Random(1), 2, len(d), d.eos())
    for bad in (dict(max_draft=-1), dict(draft_hyps=-1)):
        with pytest.raises(ValueError, match="does not fit"):
            _decode(engine, d, rows, 2, rows, **{**dict(max_draft=2, draft_hyps=1), **bad})
    batch = engine.begin(_padded(rows, d.pad()), 0)
    with pytest.raises(ValueError, match="copy sources"):
        batch.decode_beam(2, 2, d.eos(), MAX_LEN, 1, 0.0, 1.0, src=np.array([5, 6], dtype=np.int32),
                          src_len=np.array([1, 2], dtype=np.int32), max_draft=2)
