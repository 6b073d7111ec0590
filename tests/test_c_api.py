"""The C API's refusals: a model shape the engine cannot take is refused with
a message naming what is wrong (not a crash), and the engine writes into
caller memory only within the size it is given."""
import ctypes

import pytest
import torch

from fairseq_aggressive.native import NativeEngine, build, c_api
from helpers import make_model, make_sample, make_task, needs_native

pytestmark = needs_native

GOOD = dict(C=16, H=2, F=32, enc_layers=1, dec_layers=1, src_vocab=20, tgt_vocab=20, enc_normalize_before=0,
            dec_normalize_before=0, gelu=0, pad=1, unk=3, eos=2, enc_embed_scale=1.0, dec_embed_scale=1.0,
            ln_eps=1e-5, enc_dim=0)


@pytest.mark.parametrize("change, message", [
    (dict(H=0), "not a positive multiple of the heads"),
    (dict(C=18, H=4), "not a positive multiple of the heads"),
    (dict(dec_layers=0), "decoder layers"),
    (dict(F=0), "feed-forward width"),
    (dict(tgt_vocab=0), "vocabularies"),
    (dict(eos=20), "special symbol id (20) outside the vocabulary"),
    (dict(ln_eps=0.0), "epsilon"),
])
def test_a_shape_the_engine_cannot_take_is_refused_with_its_reason(change, message):
    lib = build.library()
    handle = lib.fa_model_new(ctypes.byref(c_api.Config(**{**GOOD, **change})))
    assert not handle
    assert message in lib.fa_new_error().decode()
    handle = lib.fa_model_new(ctypes.byref(c_api.Config(**GOOD)))
    assert handle and lib.fa_new_error().decode() == ""
    lib.fa_model_free(handle)


def test_the_encoder_output_is_written_only_where_it_fits():
    task = make_task()
    d = task.target_dictionary
    engine = NativeEngine(make_model(task, seed=1), d, threads=1)
    rows = [[5, 6, 7, d.eos()], [8, d.eos()]]
    batch = engine.begin(make_sample(rows, d.pad())["net_input"]["src_tokens"], 0)
    n = 6 * engine.embed_dim
    out = torch.full((n + 1,), 7.0)
    assert engine.lib.fa_encoder_out(batch.handle, out.data_ptr(), n - 1) == -1
    assert bool((out == 7.0).all())  # nothing written
    assert engine.lib.fa_encoder_out(batch.handle, out.data_ptr(), n) == n
    assert float(out[n]) == 7.0 and not bool((out[:n] == 7.0).all())
