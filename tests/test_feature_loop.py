"""The draft -> verify -> accept loop of the autoregressive feature drafter
inside the native engine (fa_decode with the feature drafter: verifier and drafter in one call
per batch): bit-identical to the generator's own loop over the same native
drafter and verifier, counters included, equal to fairseq's greedy, and used
wherever it applies."""
import pytest
import torch

from fairseq_aggressive.drafters import FeatureARDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import NativeBatch
from helpers import compare, fast_first, greedy, make_sample, make_task, needs_native, random_rows
from test_copy_loop import _bits, _counters
from test_feature_ar import verifier_and_feature_drafter
from test_narrow_feature_drafter import narrow_pair

pytestmark = needs_native

BATCHES = [(1, (1, 10), 10), (6, (1, 30), 60), (8, (5, 30), 61)]


def _decode(ar, dr, d, k, engine_loop, gen_kw, cls=FeatureARDrafter, **drafter_kw):
    drafter = cls(dr, d, k, engine="native", **drafter_kw)
    gen = build_generator([ar], d, drafter, engine="native", engine_loop=engine_loop, **gen_kw)
    outs, passes = [], []
    for bsz, (lo, hi), seed in BATCHES:
        sample = make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad())
        outs += gen.generate([ar], sample)
        passes += list(gen.last_sentence_passes)
    return outs, passes, gen.stats


def _assert_greedy(ar, d, outs, **gen_kw):
    """``outs`` (every batch of BATCHES, in order) are fairseq's greedy outputs."""
    gen_kw = gen_kw or dict(max_len_b=30)
    cmp, o = None, 0
    for bsz, (lo, hi), seed in BATCHES:
        sample = make_sample(random_rows(d, bsz, lo, hi, seed=seed), d.pad())
        cmp = compare(ar, sample, greedy(ar, d, sample, **gen_kw), outs[o: o + bsz], cmp)
        o += bsz
    assert cmp.ok() and cmp.identical == cmp.total == 15, cmp


def _counting_steps(monkeypatch):
    steps = []
    real = NativeBatch.step
    monkeypatch.setattr(NativeBatch, "step", lambda self, *a, **kw: steps.append(1) or real(self, *a, **kw))
    return steps


@pytest.mark.parametrize("narrow", fast_first([False, True]))
@pytest.mark.parametrize("k,gen_kw", fast_first([
    (4, dict(max_len_b=30)),
    (8, dict(max_len_b=30, max_draft_len=3)),
    (6, dict(max_len_a=0, max_len_b=5)),  # drafts cut by the length cap
    (5, dict(min_len=6, unk_penalty=-2.0, temperature=0.8, max_len_b=30)),
], 2), ids=["k4", "k8-cap3", "max-len", "min-len-unkpen-temperature"])
def test_engine_loop_equals_the_generators_loop(narrow, k, gen_kw, tmp_path, monkeypatch):
    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path) if narrow else verifier_and_feature_drafter(task, tmp_path)
    steps = _counting_steps(monkeypatch)
    a = _decode(ar, dr, d, k, True, gen_kw)
    assert not steps  # no pass from Python
    b = _decode(ar, dr, d, k, False, gen_kw)
    assert steps
    assert _bits(a[0]) == _bits(b[0])
    assert a[1] == b[1]  # passes per sentence
    assert _counters(a[2]) == _counters(b[2])
    assert a[2].drafted > a[2].accepted and a[2].draft_seconds > 0
    assert a[2].accepted > 0 or gen_kw.get("max_len_b") == 5  # (5 tokens leave a random drafter little to hit)
    _assert_greedy(ar, d, a[0], **{key: v for key, v in gen_kw.items() if key != "max_draft_len"})


def test_engine_loop_on_an_int8_verifier_equals_the_generators_loop(tmp_path, monkeypatch):
    from fairseq_aggressive.runtime.quantization import quantize_int8

    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path)
    ar = quantize_int8(ar)
    a = _decode(ar, dr, d, 4, True, dict(max_len_b=30))
    b = _decode(ar, dr, d, 4, False, dict(max_len_b=30))
    assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and _counters(a[2]) == _counters(b[2])
    assert a[2].accepted > 0


def test_the_engine_loop_runs_wherever_it_applies(tmp_path, monkeypatch):
    """Native verifier and native drafter: one call per batch.  The generator's
    loop where the drafter drafts in torch, the verifier is torch's,
    engine_loop=False, or a subclass drafts otherwise; the same output each way."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    steps = _counting_steps(monkeypatch)
    sample = make_sample(random_rows(d, 4, 1, 20, seed=8), d.pad())
    ref = greedy(ar, d, sample, max_len_b=20)

    class Reversed(FeatureARDrafter):  # drafts otherwise than the engine's loop would
        def propose(self, sents, outputs, caps):
            out = super().propose(sents, outputs, caps)
            for branches in out:
                branches[0].tokens.reverse()
            return out

    for kw, drafter_engine, cls, python_passes in (
            (dict(), "native", FeatureARDrafter, False),
            (dict(engine_loop=False), "native", FeatureARDrafter, True),
            (dict(), "torch", FeatureARDrafter, True),
            (dict(draft_cost="1,0.1"), "native", FeatureARDrafter, False),  # (no budget: its drafts carry no gains)
            (dict(), "native", Reversed, True)):
        steps.clear()
        gen = build_generator([ar], d, cls(dr, d, 4, engine=drafter_engine), engine="native", max_len_b=20, **kw)
        cmp = compare(ar, sample, ref, gen.generate([ar], sample))
        assert cmp.ok() and cmp.identical == 4, (kw, cmp)
        assert bool(steps) == python_passes, (kw, drafter_engine, cls)
    gen = build_generator([ar], d, FeatureARDrafter(dr, d, 4), engine="torch", max_len_b=20)
    assert compare(ar, sample, ref, gen.generate([ar], sample)).identical == 4


def test_engine_loop_refuses_what_does_not_fit(tmp_path):
    """A batch already decoded, or a drafter that reads another verifier's
    features (another width): a clear error, nothing decoded."""
    from helpers import make_model

    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    sample = make_sample(random_rows(d, 2, 3, 9, seed=4), d.pad())
    gen = build_generator([ar], d, FeatureARDrafter(dr, d, 4), engine="native", max_len_b=20)
    verifier, drafter = gen.verifier, gen.drafter

    def loop(v):  # the feature drafter's loop, as FeatureARDrafter.decode_in_engine asks for it
        return v.decode_in_engine("feature", d.eos(), None, drafter=(drafter.native.engine, drafter.native.state),
                                  bos=d.eos(), k=4, room=255)

    verifier.begin(sample, 20)
    drafter.begin(sample, 20, verifier.encoder_out())
    toks, scores, passes, st = loop(verifier)
    assert len(toks) == 2 and all(t[-1] == d.eos() for t in toks) and st.sentence_passes == sum(passes)
    with pytest.raises(ValueError, match="decodes once"):  # its sentences are decoded
        loop(verifier)
    # the drafter reads 32-wide features; this verifier's are 16 wide
    small = make_model(task, seed=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
                       decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2)
    other = build_generator([small], d, FeatureARDrafter(dr, d, 4), engine="native", max_len_b=20).verifier
    other.begin(sample, 20)
    verifier.begin(sample, 20)
    drafter.begin(sample, 20, verifier.encoder_out())
    with pytest.raises(ValueError, match="read this verifier's features"):
        loop(other)
    toks2, _, _, _ = loop(verifier)  # the refused call decoded nothing
    assert toks2 == toks


@pytest.mark.parametrize("int8_verifier", [False, True])
def test_engine_loop_with_an_int8_drafter_equals_the_generators_loop(int8_verifier, tmp_path, monkeypatch):
    """An int8 drafter (--drafter-precision int8) in the engine's loop: the generator's loop bit
    for bit, on a float32 and on an int8 verifier; the float32 verifier's output is greedy's."""
    import copy

    from fairseq_aggressive.runtime.quantization import quantize_int8

    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path)
    dr = quantize_int8(copy.deepcopy(dr))
    if int8_verifier:
        ar = quantize_int8(ar)
    steps = _counting_steps(monkeypatch)
    a = _decode(ar, dr, d, 6, True, dict(max_len_b=30))
    assert not steps
    b = _decode(ar, dr, d, 6, False, dict(max_len_b=30))
    assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and _counters(a[2]) == _counters(b[2])
    assert a[2].accepted > 0
    if not int8_verifier:
        _assert_greedy(ar, d, a[0])


@pytest.mark.parametrize("narrow", [False, True])
def test_engine_loop_with_draft_confidence_equals_the_generators_loop(narrow, tmp_path, monkeypatch):
    """--draft-confidence in the engine's loop: the generator's loop bit for bit (drafts that
    end where the drafter is unsure: fewer drafted tokens), and greedy's output."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = narrow_pair(task, tmp_path) if narrow else verifier_and_feature_drafter(task, tmp_path)
    steps = _counting_steps(monkeypatch)
    full = _decode(ar, dr, d, 6, True, dict(max_len_b=30))
    a = _decode(ar, dr, d, 6, True, dict(max_len_b=30), min_prob=0.45)
    assert not steps
    b = _decode(ar, dr, d, 6, False, dict(max_len_b=30), min_prob=0.45)
    assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and _counters(a[2]) == _counters(b[2])
    assert 0 < a[2].drafted < full[2].drafted
    _assert_greedy(ar, d, a[0])
