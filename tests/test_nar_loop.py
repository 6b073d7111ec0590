"""GAD's block drafter inside the native engine's loop (the engine's "nar"
drafter, csrc/loop/nar_drafter.cpp): a batch decoded in one call is the
generator's own loop over the same native drafter and verifier bit for bit,
passes and counters included, fairseq's greedy under exact acceptance, and
its rows stream through a running batch as the static batch decodes them."""
import pytest

from fairseq_aggressive.acceptance import build_acceptance
from fairseq_aggressive.drafters import NARBlockDrafter
from fairseq_aggressive.generator import build_generator
from helpers import fast_first, make_model, make_sample, make_task, needs_native, random_rows
from test_copy_loop import _bits, _counters
from test_feature_loop import _assert_greedy, _counting_steps
from test_feature_loop import _decode as _feature_decode
from test_gad_shared_drafter import shared_drafter
from test_gad_verifier_features import verifier_and_drafter

pytestmark = needs_native


def _pair(variant, task, tmp_path):
    """(verifier, block drafter) of a variant."""
    if variant == "own encoder":
        return make_model(task, seed=3), make_model(task, arch="block_nat", seed=11, decoder_layers=1)
    if variant == "own encoder, causal prefix, pre-norm":
        return make_model(task, seed=3), make_model(task, arch="block_nat", seed=12, decoder_layers=2,
                                                    block_causal_prefix=True, decoder_normalize_before=True)
    if variant == "shared encoder, causal prefix":
        ar = make_model(task, seed=3)
        return ar, shared_drafter(task, ar, tmp_path, decoder_layers=2, block_causal_prefix=True)
    if variant == "verifier features, causal prefix":
        return verifier_and_drafter(task, tmp_path, causal=True)
    if variant == "verifier features, bidirectional":
        return verifier_and_drafter(task, tmp_path, causal=False)
    raise KeyError(variant)


VARIANTS = ["own encoder", "own encoder, causal prefix, pre-norm", "shared encoder, causal prefix",
            "verifier features, causal prefix", "verifier features, bidirectional"]


def _decode(ar, dr, d, k, engine_loop, gen_kw, acceptance=None):
    """(outputs, passes per sentence, counters) of BATCHES, test_feature_loop's way, with GAD's drafter."""
    return _feature_decode(ar, dr, d, k, engine_loop, dict(gen_kw, acceptance=acceptance), cls=NARBlockDrafter)


@pytest.mark.parametrize("variant", fast_first(VARIANTS, 2))
@pytest.mark.parametrize("k,gen_kw", fast_first([
    (4, dict(max_len_b=30)),
    (8, dict(max_len_b=30, max_draft_len=3)),
    (6, dict(max_len_a=0, max_len_b=5)),  # drafts cut by the length cap
    (5, dict(min_len=6, unk_penalty=-2.0, temperature=0.8, max_len_b=30)),
], 1), ids=["k4", "k8-cap3", "max-len", "min-len-unkpen-temperature"])
def test_engine_loop_equals_the_generators_loop(variant, k, gen_kw, tmp_path, monkeypatch):
    task = make_task()
    d = task.target_dictionary
    ar, dr = _pair(variant, task, tmp_path)
    steps = _counting_steps(monkeypatch)
    a = _decode(ar, dr, d, k, True, gen_kw)
    assert not steps  # no pass from Python
    b = _decode(ar, dr, d, k, False, gen_kw)
    assert steps
    assert _bits(a[0]) == _bits(b[0])
    assert a[1] == b[1]  # passes per sentence
    assert _counters(a[2]) == _counters(b[2])
    assert a[2].drafted > a[2].accepted and a[2].draft_seconds > 0
    _assert_greedy(ar, d, a[0], **{key: v for key, v in gen_kw.items() if key != "max_draft_len"})


def test_gad_plus_plus_in_the_engine_equals_the_generators_loop(tmp_path, monkeypatch):
    """GAD++'s top-beta/tau acceptance (not greedy's output) in the engine's loop:
    the generator's loop bit for bit."""
    task = make_task()
    d = task.target_dictionary
    ar, dr = _pair("own encoder, causal prefix, pre-norm", task, tmp_path)
    steps = _counting_steps(monkeypatch)
    a = _decode(ar, dr, d, 5, True, dict(max_len_b=30), build_acceptance(3, 5.0))
    assert not steps
    b = _decode(ar, dr, d, 5, False, dict(max_len_b=30), build_acceptance(3, 5.0))
    assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and _counters(a[2]) == _counters(b[2])
    assert a[2].accepted > _decode(ar, dr, d, 5, True, dict(max_len_b=30))[2].accepted  # looser: more accepted


def test_gad_streams_through_a_running_batch(tmp_path):
    """Rows of a GAD generator joining a running batch one by one, in another
    order: each sentence's tokens are the static batch's, drafted in the engine."""
    from fairseq_aggressive.streaming.decoder import RunningDecoder

    task = make_task()
    d = task.target_dictionary
    for variant in ("own encoder", "verifier features, causal prefix"):
        ar, dr = _pair(variant, task, tmp_path)
        gen = build_generator([ar], d, NARBlockDrafter(dr, d, 4, engine="native"), engine="native", max_len_b=30)
        run = RunningDecoder.of_generator(gen, draft_cost="off")
        assert run is not None and run.spec.kind == "nar", variant
        rows = random_rows(d, 6, 1, 30, seed=21)
        ref = gen.generate([ar], make_sample(rows, d.pad()))
        batch = run.make_batch()
        order = [3, 0, 5, 1, 4, 2]
        got = {}
        for i in order:  # one joins per pass
            src = [t for t in rows[i] if t != d.pad()]
            slot = batch.join([src], [[]], [30])[0]
            got[slot] = i
            for s in batch.run(max_passes=1):
                toks, _, _ = batch.take(s, 64)
                assert toks == ref[got.pop(s)][0]["tokens"].tolist(), variant
        while batch.active:
            for s in batch.run():
                toks, _, _ = batch.take(s, 64)
                assert toks == ref[got.pop(s)][0]["tokens"].tolist(), variant
        assert not got and batch.stats().loop.drafted > 0, variant
