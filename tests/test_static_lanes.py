"""A static batch dealt among one-thread lanes (fairseq_aggressive/native/lanes.py):
its sentences decoded by other engines on the same weights, at once, give the
whole batch's tokens, scores and passes bit for bit, whether the lanes encode
their own sentences or take them from a batch already encoded; the counters are
the parts' sums; a sentence leaves a batch once, and a batch that gave some up
decodes no more; a lane's failure is raised after every lane finished."""
import threading

import numpy as np
import pytest

from helpers import make_model, make_sample, make_task, needs_native, random_rows

pytestmark = needs_native


@pytest.fixture(scope="module")
def setup():
    from fairseq_aggressive.native.engine import NativeEngine

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256).eval()
    d = task.target_dictionary
    engine = NativeEngine(model, d, threads=2)
    rows = random_rows(d, 13, 3, 25, seed=11) + [r[:-1] * 3 + [d.eos()] for r in random_rows(d, 4, 3, 8, seed=12)]
    return engine, d, make_sample(rows, d.pad())["net_input"]["src_tokens"], rows


def _copy(rows):
    return np.concatenate([np.asarray(r, dtype=np.int32) for r in rows]), np.asarray([len(r) for r in rows])


@pytest.mark.parametrize("kind", ["greedy", "copy"])
def test_lanes_give_the_whole_batchs_bits(setup, kind):
    from fairseq_aggressive.native.lanes import decode_in_lanes
    from fairseq_aggressive.native.running import run_settings

    engine, d, src, rows = setup
    run = run_settings(kind, d.eos(), None if kind == "copy" else 0, budget=False, ngram_min=1, ngram_max=4)
    copy, copy_len = _copy(rows)
    max_len = 40
    whole = engine.begin(src, max_len).decode(run, max_len, copy, copy_len)
    for k in (2, 3, 5):
        lanes = engine.lanes(k)
        assert len(lanes) == k and all(e.threads == 1 for e in lanes) and engine.lanes(k) is lanes
        encoded = decode_in_lanes(lanes, run, max_len, copy, copy_len, batch=engine.begin(src, max_len))
        own = decode_in_lanes(lanes, run, max_len, copy, copy_len, src_tokens=src)
        for got in (encoded, own):
            assert got[:3] == whole[:3], k  # tokens, scores (floats, exactly), passes
            for name in ("sentence_passes", "drafted", "accepted", "emitted", "joined"):
                assert getattr(got[3], name) == getattr(whole[3], name), (k, name)
            assert got[3].passes >= whole[3].passes  # each lane passes over its own rows
    if kind == "copy":
        assert whole[3].accepted > 0


def test_a_sentence_leaves_a_batch_once(setup):
    from fairseq_aggressive.native.running import run_settings

    engine, d, src, rows = setup
    batch = engine.begin(src, 40)
    part = batch.take([1, 4], engine.lanes(2)[0])
    assert part.src_keep.shape[0] == 2
    for bad in ([4], [99], [-1], [2, 2]):
        with pytest.raises(ValueError, match="cannot leave a batch"):
            batch.take(bad, engine)
    run = run_settings("greedy", d.eos(), 0)
    with pytest.raises(ValueError, match="does not fit the batch"):  # sentences 1 and 4 are gone
        batch.decode(run, 40)
    alone = engine.begin(src[[1, 4]], 40).decode(run, 40)
    assert part.decode(run, 40)[:3] == alone[:3]


def test_a_lanes_failure_is_raised_after_every_lane_finished(setup, monkeypatch):
    from fairseq_aggressive.native import batch as native_batch
    from fairseq_aggressive.native.lanes import decode_in_lanes
    from fairseq_aggressive.native.running import run_settings

    engine, d, src, rows = setup
    real, calls = native_batch.NativeBatch.decode, []

    def decode(self, *a, **k):
        calls.append(threading.current_thread().name)
        if len(self.src_keep) == 5:  # (17 sentences in 3 lanes: 6, 6, 5)
            raise RuntimeError("native engine: the decoding loop failed (injected)")
        return real(self, *a, **k)

    monkeypatch.setattr(native_batch.NativeBatch, "decode", decode)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="injected"):
        decode_in_lanes(engine.lanes(3), run_settings("greedy", d.eos(), 0), 40, src_tokens=src)
    assert len(calls) == 3 and threading.active_count() == before


def test_lanes_by_default_only_where_a_pass_reads_few_weight_bytes(monkeypatch):
    """A pass's weight bytes are the decoder's products (but the encoder-attention keys and
    values, made once per sentence) and the output projection, 4 bytes a float32 weight; the
    default lanes (a stream's and a static batch's) are one per thread below LANE_WEIGHT_BYTES
    and 1 from it on."""
    from fairseq_aggressive.native import engine as native_engine

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256).eval()
    engine = native_engine.NativeEngine(model, task.target_dictionary, threads=2)
    dec = model.decoder
    expected = dec.output_projection.weight.numel()
    for layer in dec.layers:
        for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.out_proj,
                    layer.encoder_attn.q_proj, layer.encoder_attn.out_proj, layer.fc1, layer.fc2):
            expected += lin.weight.numel()
    assert engine.half_linears == 0 and engine.int8_linears == 0
    assert engine.pass_weight_bytes >= 4 * expected  # (panels pad the outputs to whole vectors)
    assert engine.pass_weight_bytes < 4 * expected * 1.1
    assert engine.threads == 2 and engine.default_lanes() == 2
    monkeypatch.setattr(native_engine, "LANE_WEIGHT_BYTES", engine.pass_weight_bytes)
    assert engine.default_lanes() == 1
    monkeypatch.setattr(native_engine, "LANE_WEIGHT_BYTES", engine.pass_weight_bytes + 1)
    assert engine.default_lanes() == 2


def test_a_streams_lanes_also_where_the_weights_are_a_small_share_of_the_last_level_cache(monkeypatch):
    """A stream's default lanes are one per thread where the weights a pass reads are below
    LANE_WEIGHT_BYTES or below 1 / STREAM_LANE_CACHE_SHARE of the last-level cache; a static
    batch's only below LANE_WEIGHT_BYTES."""
    from fairseq_aggressive.native import engine as native_engine
    from fairseq_aggressive.runtime import cpu_features

    task = make_task()
    engine = native_engine.NativeEngine(make_model(task).eval(), task.target_dictionary, threads=2)
    share, weights = native_engine.STREAM_LANE_CACHE_SHARE, engine.pass_weight_bytes
    monkeypatch.setattr(native_engine, "LANE_WEIGHT_BYTES", weights)
    for cache, lanes in ((0, 1), (weights * share, 1), ((weights + 1) * share, 2)):
        monkeypatch.setattr(cpu_features, "last_level_cache_bytes", lambda cache=cache: cache)
        assert engine.default_lanes(stream=True) == lanes
        assert engine.default_lanes() == 1
    monkeypatch.setattr(native_engine, "LANE_WEIGHT_BYTES", weights + 1)
    assert engine.default_lanes(stream=True) == engine.default_lanes() == 2
