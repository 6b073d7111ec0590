"""The native engine (fairseq_aggressive/native): exact against stock fairseq
greedy, bit-identical between its aggressive and greedy decoding and between
its build targets (every one this CPU runs), refusals and fallbacks."""
import os
import random
import re

import pytest

from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.native import NativeEngine, NativeUnavailable, build, targets
from fairseq_aggressive.verifiers import NativeVerifier
from helpers import (NATIVE_REASON, compare, fast_first, greedy, greedy_rows, make_model, make_sample, make_task,
                     needs_native)
from test_equivalence import SHAPES, NoisyOracleDrafter, batches, random_sources

NATIVE_SHAPES = {k: v for k, v in SHAPES.items() if "normformer" not in k and "output dim" not in k}
NATIVE_SHAPES["gelu, post-norm, 8 heads"] = dict(activation_fn="gelu", encoder_attention_heads=8,
                                                 decoder_attention_heads=8)
# the build targets this CPU runs besides the default one (generic-amx differs from generic-wide
# in its int8 products only: tests/test_amx.py decodes on it, through its test library)
OTHER_TARGETS = [t for t in build.runnable_targets()
                 if NATIVE_REASON is None and t != build.cpu_targets()[0].name and t != "generic-amx"]
# those a wheel carries (make setup compiled them), and the test-only ones (generic-wide), compiled on
# demand: the tests that compare every target take them as two sets, the second in the slow tier
_SHIPPED = {t.name for t in targets.shipped()}
TARGET_SETS = [pytest.param([t for t in OTHER_TARGETS if t in _SHIPPED], id="shipped"),
               pytest.param([t for t in OTHER_TARGETS if t not in _SHIPPED], id="test-only", marks=pytest.mark.slow)]


def _decode(model, task, rows, bsz, engine="native", native=None, drafter=None, **kw):
    d = task.target_dictionary
    gen = build_generator([model], d, drafter or InputCopyDrafter(d, d), engine=engine, **kw)
    if native is not None:  # decode on this engine (e.g. a generic build)
        gen.verifier = NativeVerifier(native, model, gen.verifier.rules, gen.acceptance)
    outs = []
    for i, chunk in enumerate(batches(rows, bsz)):
        if drafter is not None:  # an oracle drafter indexes sentences of the whole list
            drafter.ref_offset = i * bsz
        outs += gen.generate([model], make_sample(chunk, d.pad()))
    return outs, gen


class Oracle(NoisyOracleDrafter):
    """Greedy's continuation with corruptions, for sentences of a whole list."""

    ref_offset = 0

    def one(self, sent, output, cap):
        return super().one(sent + self.ref_offset, output, cap)


def _same_bits(a, b):
    """Hypotheses identical token for token and score for score (exact floats)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0]["tokens"].tolist() == y[0]["tokens"].tolist()
        assert x[0]["positional_scores"].tolist() == y[0]["positional_scores"].tolist()
        assert float(x[0]["score"]) == float(y[0]["score"])


@needs_native
@pytest.mark.parametrize("shape", fast_first(list(NATIVE_SHAPES)))
@pytest.mark.parametrize("bsz", fast_first([8, 1]))
def test_native_iad_matches_fairseq_greedy(shape, bsz):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=11, **NATIVE_SHAPES[shape])
    rng = random.Random(bsz)
    rows = random_sources(rng, 32, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    cmp, accepted = None, 0
    each = greedy_rows(model, d, rows, max_len_b=40) if bsz == 1 else None  # batch 1's references in 8s
    for n, chunk in enumerate(batches(rows, bsz)):
        sample = make_sample(chunk, d.pad())
        ref = each[n : n + 1] if each else greedy(model, d, sample, max_len_b=40)
        for drafter in (InputCopyDrafter(d, d), NoisyOracleDrafter(ref, rng, 0.1, len(d))):
            gen = build_generator([model], d, drafter, engine="native", max_len_b=40)
            assert gen.native is not None
            cmp = compare(model, sample, ref, gen.generate([model], sample), cmp)
            accepted += gen.stats.accepted
    assert cmp.ok(), cmp
    assert cmp.identical + cmp.near_ties == 2 * len(rows)
    assert accepted > 0  # drafts were verified, not just single steps


@needs_native
@pytest.mark.parametrize("gen_kw", fast_first([dict(max_len_a=0, max_len_b=3), dict(min_len=5, max_len_b=30),
                                               dict(unk_penalty=-3.0, max_len_b=30),
                                               dict(len_penalty=0.5, temperature=0.7, max_len_b=30)]),
                         ids=["max-len", "min-len", "unkpen", "lenpen-temperature"])
def test_native_honours_generation_options(gen_kw):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    rows = random_sources(random.Random(7), 40, len(d), d.eos())
    for bsz in (1, 8):
        cmp = None
        gen = build_generator([model], d, InputCopyDrafter(d, d), engine="native", **gen_kw)
        for chunk in batches(rows, bsz):
            sample = make_sample(chunk, d.pad())
            cmp = compare(model, sample, greedy(model, d, sample, **gen_kw), gen.generate([model], sample), cmp)
        assert cmp.ok(), cmp


@needs_native
def test_native_aggressive_is_bit_identical_to_native_greedy():
    """Row-independent arithmetic: a pass over [last, draft] gives the logits of
    one-token steps bit for bit, so IAD (any draft cap, any batch) equals the
    engine's own greedy search (empty drafts) exactly, scores included."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=5, encoder_normalize_before=True, decoder_normalize_before=True)
    rng = random.Random(3)
    rows = random_sources(rng, 24, len(d), d.eos()) + random_sources(rng, 24, len(d), d.eos(), repeat=True)
    ref, g0 = _decode(model, task, rows, 1, max_len_b=40, max_draft_len=0)
    assert g0.stats.drafted == 0
    for bsz, lmax in ((1, None), (8, 1024), (8, 3)):
        for p in (0.0, 0.2):
            drafter = Oracle(ref, rng, p, len(d))
            out, gen = _decode(model, task, rows, bsz, drafter=drafter, max_len_b=40, max_draft_len=lmax)
            assert gen.stats.accepted > 0
            _same_bits(ref, out)
        out, gen = _decode(model, task, rows, bsz, max_len_b=40, max_draft_len=lmax)  # IAD
        _same_bits(ref, out)


@needs_native
@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_projection_rounds_never_change_a_result(monkeypatch, precision):
    """A pass projects a drafted path lazily (the last token first, then the
    rest while the draft holds) or, with projection weights beyond the L2, all
    of it in one round: the same tokens and scores bit for bit either way, equal
    to the engine's own greedy, with drafts rejected early and late, batch 1
    and 8, several branches per row, in the engine's loop and the Python one,
    and with the lengths of the engine's draft-length budget."""
    from fairseq_aggressive.native import build, engine as native_engine
    from fairseq_aggressive.runtime.quantization import quantize_int8

    monkeypatch.setattr(native_engine, "library", build.test_library)
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=11, encoder_normalize_before=True, decoder_normalize_before=True)
    if precision == "int8":
        model = quantize_int8(model).eval()
    rng = random.Random(4)
    rows = random_sources(rng, 16, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    results = {}
    for eager in (-1, 0):
        def decode(bsz, **kw):
            gen = build_generator([model], d, kw.pop("drafter", None) or InputCopyDrafter(d, d),
                                      engine="native", max_len_b=40, **kw)
            gen.native.lib.fa_set_eager_projection_bytes(gen.native.handle, eager)
            outs = []
            for chunk in batches(rows, bsz):
                outs += gen.generate([model], make_sample(chunk, d.pad()))
            return outs, gen

        ref, g0 = decode(1, max_draft_len=0)
        assert g0.stats.drafted == 0
        runs = [ref]
        # the drafts as made (draft_cost="off"), then lengths by the engine's draft-length budget (IAD's default)
        for bsz, lmax, kw in ((1, None, {}), (8, 6, {}), (8, None, dict(engine_loop=False)),
                              (8, 4, dict(drafter=InputCopyDrafter(d, d, branches=3))),
                              (1, None, dict(draft_cost=None)), (8, None, dict(draft_cost=None))):
            kw.setdefault("draft_cost", "off")
            out, gen = decode(bsz, max_draft_len=lmax, **kw)
            if kw["draft_cost"] == "off":  # early and late rejections
                assert gen.stats.accepted > 0 and gen.stats.accepted < gen.stats.drafted
            _same_bits(ref, out)
            runs.append(out)
        results[eager] = runs
    for lazy, eager in zip(results[-1], results[0]):
        _same_bits(lazy, eager)


@needs_native
@pytest.mark.parametrize("others", TARGET_SETS)
def test_float16_valued_weights_are_stored_as_float16(others):
    """A model whose weights are float16 values (fairseq --fp16 checkpoints,
    float16 exports such as the shipped model) is stored as float16 where the
    target widens halves in hardware (F16C: avx2, avx512*): same arithmetic,
    so still exact; the generic targets widen them once when packing, and
    every target gives the same bits."""
    import torch

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=12, encoder_normalize_before=True, decoder_normalize_before=True)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
        model.decoder.layers[0].fc1.weight[0, 0] += 2 ** -20  # not a float16 value any more
    rows = random_sources(random.Random(4), 32, len(d), d.eos(), repeat=True)
    out, gen = _decode(model, task, rows, 8, max_len_b=40)
    # 2 encoder + 2 decoder layers: 4 + 7 + 7 + (1 projection) linear groups, fc1 of decoder layer 0 excluded
    assert gen.native.half_linears == (2 * 4 + 2 * 7 + 1 - 1 if gen.native.isa.startswith("avx") else 0)
    cmp = None
    for chunk, o in zip(batches(rows, 8), batches(out, 8)):
        sample = make_sample(chunk, d.pad())
        cmp = compare(model, sample, greedy(model, d, sample, max_len_b=40), o, cmp)
    assert cmp.ok() and cmp.identical == len(rows), cmp
    for isa in others:
        other = NativeEngine(model, d, isa=isa)
        assert other.half_linears == (gen.native.half_linears if other.isa.startswith("avx") else 0)
        _same_bits(out, _decode(model, task, rows, 8, native=other, max_len_b=40)[0])


@needs_native
@pytest.mark.slow
def test_transformer_big_layer_shape():
    """Transformer-big's layer shape (d=1024, 16 heads, ffn 4096; one layer a
    side, random weights), batch 1 and 8, with IAD and with accepted noisy
    drafts: equal to fairseq's greedy up to counted near-ties (greedy's top two
    log-probs within float rounding, the only difference the engine's other
    summation order allows), and bit for bit its own greedy on every target."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=21, encoder_layers=1, decoder_layers=1, encoder_embed_dim=1024,
                       decoder_embed_dim=1024, encoder_ffn_embed_dim=4096, decoder_ffn_embed_dim=4096,
                       encoder_attention_heads=16, decoder_attention_heads=16)
    rng = random.Random(22)
    rows = random_sources(rng, 4, len(d), d.eos()) + random_sources(rng, 4, len(d), d.eos(), repeat=True)
    ref, _ = _decode(model, task, rows, 1, max_len_b=20, max_draft_len=0)  # the engine's greedy
    cmp = None
    for bsz in (1, 8):
        out, gen = _decode(model, task, rows, bsz, drafter=Oracle(ref, rng, 0.2, len(d)), max_len_b=20)
        assert gen.stats.accepted > 0
        _same_bits(ref, out)
        iad, _ = _decode(model, task, rows, bsz, max_len_b=20)
        _same_bits(ref, iad)
        for chunk, o in zip(batches(rows, bsz), batches(iad, bsz)):
            sample = make_sample(chunk, d.pad())
            cmp = compare(model, sample, greedy(model, d, sample, max_len_b=20), o, cmp)
    assert cmp.ok() and cmp.identical + cmp.near_ties == 2 * len(rows), cmp
    # (drafts as made on the other targets: the draft-length policy's first measurement of its passes
    # takes 15 s on the scalar generic build at this width)
    for isa in OTHER_TARGETS:
        _same_bits(ref, _decode(model, task, rows, 8, native=NativeEngine(model, d, isa=isa), max_len_b=20,
                                draft_cost="off")[0])


@needs_native
@pytest.mark.parametrize("isa", [t if t in _SHIPPED else pytest.param(t, marks=pytest.mark.slow)
                                 for t in OTHER_TARGETS])
def test_every_target_is_bit_identical(isa):
    """Every build target this CPU runs (the generic one ARM and non-AVX2 CPUs
    get, the AVX-512 layout in portable code, AVX-512 where present) computes
    the same bits as the default one."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=8, encoder_attention_heads=2, decoder_attention_heads=2)
    rows = random_sources(random.Random(9), 24, len(d), d.eos(), repeat=True)
    other = NativeEngine(model, d, isa=isa)
    assert other.isa == isa.replace("-wide", "")
    ref, gen = _decode(model, task, rows, 4, max_len_b=30)
    out, _ = _decode(model, task, rows, 4, native=other, max_len_b=30)
    assert gen.native.isa == build.cpu_targets()[0].name
    _same_bits(ref, out)


@needs_native
@pytest.mark.parametrize("others", TARGET_SETS)
def test_native_isa_option_picks_the_target(others):
    """``--native-isa TARGET`` (the generator's ``native_isa``) decodes on that
    build target, with the default target's bits; a bad name is a clear
    error at task creation and in the generator; the benchmark's ``:TARGET``
    suffix sets it for native modes only."""
    import argparse

    from fairseq_aggressive.bench.modes import mode_overrides, reference_mode
    from fairseq_aggressive.tasks.aggressive_translation import (AggressiveTranslationConfig,
                                                                 AggressiveTranslationTask)

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    rows = random_sources(random.Random(5), 12, len(d), d.eos(), repeat=True)
    ref, gen = _decode(model, task, rows, 4, max_len_b=30)
    for isa in others:
        out, other = _decode(model, task, rows, 4, max_len_b=30, native_isa=isa)
        assert other.native.isa == isa.replace("-wide", "")
        _same_bits(ref, out)
    with pytest.raises(ValueError, match="--native-isa must be auto or one of"):
        build_generator([model], d, InputCopyDrafter(d, d), native_isa="avx9")
    with pytest.raises(ValueError, match="--native-isa"):
        AggressiveTranslationTask(AggressiveTranslationConfig(native_isa="sse"), d, d)
    args = argparse.Namespace()
    assert mode_overrides("iad:avx2", args) == dict(beam=1, decoding="iad", native_isa="avx2")
    assert mode_overrides("greedy-native-int8:generic", args)["native_isa"] == "generic"
    assert reference_mode("iad-int8:avx2", ["greedy", "greedy-int8"]) == "greedy-int8"
    for bad in ("greedy:avx2", "iad-torch:avx2", "ct2:avx2", "iad:avx9"):
        with pytest.raises(SystemExit, match="benchmark mode"):
            mode_overrides(bad, args)


def test_unsupported_model_is_refused_or_falls_back():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1, **SHAPES["normformer-style extras"])
    with pytest.raises(ValueError, match="--engine native: .*normformer"):
        build_generator([model], d, InputCopyDrafter(d, d), engine="native")
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine="auto")
    assert gen.native is None  # decodes with the torch verifier (tested in test_equivalence)
    with pytest.raises(ValueError, match="--engine must be one of"):
        build_generator([model], d, InputCopyDrafter(d, d), engine="fast")


def test_disabled_or_failed_build_falls_back(monkeypatch, tmp_path, caplog):
    """Whatever keeps the engine from loading (disabled, no library and no
    sources, a compiler that fails, a broken library file, a target this CPU
    lacks): NativeUnavailable with the reason, one warning and the torch path
    under --engine auto, a clear error under --engine native, nothing half
    written in the cache."""
    import logging

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=2)
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_NO_NATIVE", "1")
    assert build_generator([model], d, InputCopyDrafter(d, d)).native is None
    monkeypatch.delenv("FAIRSEQ_AGGRESSIVE_NO_NATIVE")
    if not build.cpu_targets():
        pytest.skip("no native engine on this CPU")
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "packaged", lambda target: None)  # an installation without its libraries

    def falls_back(match):
        with pytest.raises(NativeUnavailable, match=re.escape(match)) as err:
            build.library()
        assert err.value.setup
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="fairseq_aggressive"):
            assert build_generator([model], d, InputCopyDrafter(d, d)).native is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "torch path" in warnings[0] and match.split(" ")[0] in warnings[0], warnings
        with pytest.raises(ValueError, match=re.escape("--engine native: " + match)):
            build_generator([model], d, InputCopyDrafter(d, d), engine="native")

    # a compiler that fails
    monkeypatch.setenv("CXX", "false")
    falls_back("building the native engine failed")
    assert os.listdir(tmp_path) == []
    # no compiler at all
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    falls_back("no C++ compiler found")
    # neither a library nor the sources (a wheel missing its libraries)
    monkeypatch.setattr(build, "CSRC", str(tmp_path / "missing"))
    falls_back("this installation has no compiled native engine")
    # a library file that is not one
    bad = tmp_path / "_engine_bad.so"
    bad.write_bytes(b"not a shared library")
    monkeypatch.setattr(build, "packaged", lambda target: str(bad))
    falls_back("cannot load the native engine")
    # a target this CPU lacks, or no such target
    monkeypatch.setattr(build, "_cpu_flags", lambda: {"fma"})
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_ISA", "avx2")
    falls_back("FAIRSEQ_AGGRESSIVE_ISA: target avx2 needs CPU features this CPU lacks")
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_ISA", "sse9")
    falls_back("FAIRSEQ_AGGRESSIVE_ISA: unknown target 'sse9'")


def test_bench_engine_modes():
    import argparse

    from fairseq_aggressive.bench.modes import mode_overrides

    args = argparse.Namespace(drafter_path=None)
    assert mode_overrides("greedy-native", args) == dict(beam=1, decoding="iad", max_draft_len=0, engine="native")
    assert mode_overrides("iad@4-torch", args) == dict(beam=1, decoding="iad", max_draft_len=4, engine="torch")
    # fairseq's beam search in the engine is a mode of its own; -torch is for aggressive modes
    assert mode_overrides("beam5-native", args) == dict(beam=5, decoding="beam", engine="native")
    with pytest.raises(SystemExit, match="applies to aggressive modes"):
        mode_overrides("beam5-torch", args)


def test_bench_counts_near_ties():
    """The benchmark's near-tie count: an output that first differs from
    greedy's at a token with the same log-probability (two identical rows of
    the output projection) is a near-tie; at a token with another one it is not."""
    import torch

    from fairseq_aggressive.bench.run import count_near_ties

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    rows = random_sources(random.Random(5), 12, len(d), d.eos())
    hyps = [greedy(model, d, make_sample([r], d.pad()), max_len_b=20)[0][0]["tokens"].tolist() for r in rows]
    i = next(i for i, h in enumerate(hyps) if len(h) >= 3)
    toks, k = hyps[i], 1
    twin = next(t for t in range(d.nspecial, len(d)) if t not in toks)
    other = list(toks)
    other[k] = twin
    per_sent = {i: {"greedy": {"tokens": toks}, "iad": {"tokens": other}, "src_tokens": rows[i]}}
    models = {"greedy": model, "iad": model}
    assert count_near_ties(["greedy", "iad"], per_sent, models, d.eos()) == {"iad": 0}
    w = model.decoder.output_projection.weight
    with torch.no_grad():
        w[twin] = w[toks[k]]  # the same logit as greedy's choice
    assert count_near_ties(["greedy", "iad"], per_sent, models, d.eos()) == {"iad": 1}
    per_sent[i]["iad"]["tokens"] = toks  # identical outputs are not counted
    assert count_near_ties(["greedy", "iad"], per_sent, models, d.eos()) == {"iad": 0}


@needs_native
def test_a_library_of_another_api_is_refused(monkeypatch):
    """A library that is not this API (no version, another version, structs of
    other sizes than the Python mirrors) is refused with what differs and how
    to rebuild, never called into."""
    import ctypes

    from fairseq_aggressive.native import c_api, library

    lib = library()
    assert c_api.mismatch(lib) is None
    assert c_api.mismatch(ctypes.CDLL(None)) == "it has no fa_version()"  # the interpreter itself
    with monkeypatch.context() as m:
        m.setattr(c_api, "API_VERSION", c_api.API_VERSION + 1)
        assert c_api.mismatch(lib) == (f"its API version is {c_api.API_VERSION - 1}, "
                                       f"this Python code expects {c_api.API_VERSION}")
        with pytest.raises(NativeUnavailable, match="does not match this fairseq_aggressive .*reinstall"):
            build._load(lib._name)
    wider = type("PassArgs", (ctypes.Structure,), {"_fields_": c_api.PassArgs._fields_ + [("extra", ctypes.c_int64)]})
    with monkeypatch.context() as m:
        m.setattr(c_api, "PassArgs", wider)
        assert re.fullmatch(r"its PassArgs has \d+ bytes, the Python mirror \d+", c_api.mismatch(lib))
    assert c_api.mismatch(lib) is None  # (declares the library's signatures with the real mirrors again)


@needs_native
@pytest.mark.parametrize("kind", ["float32", "float16", "int8"])
@pytest.mark.parametrize("isa", fast_first(["default", "generic-amx"]))  # generic-amx: 16-register tile shapes
def test_linear_rows_give_the_same_bits_in_any_block(kind, isa):
    """The linear kernels split M rows into register tiles of up to 9 rows (one
    block up to 9 with AVX-512, else blocks of at most 6, int8 in tiles of its
    own shapes there) and outputs into panels across threads: every row's
    outputs are the bits that row alone gets, for every M, thread count and a
    width that ends in a partial panel, with and without the tiles that ask for
    their weights ahead, with the panel groups in either order (a decoder's
    passes alternate it); on the default target and on the portable code's
    16-register shapes (its int8 on the vector tiles, not the emulated AMX ones)."""
    import ctypes
    import numpy as np

    lib = build.test_library(None if isa == "default" else isa)
    # generic-amx: its int8 products on the vector tiles (the emulated AMX tiles: tests/test_amx.py)
    previous = lib.fa_set_amx_min_rows(1000) if isa == "generic-amx" else None
    rng = np.random.default_rng(5)
    N, K = 203, 72  # 12 full 16-output panels and a partial one; K not a multiple of the int8 groups
    if kind == "int8":
        W = rng.integers(-127, 128, size=(N, K), dtype=np.int8)
    else:
        W = rng.standard_normal((N, K)).astype(np.float16 if kind == "float16" else np.float32)
    W = np.ascontiguousarray(W.view(np.uint16) if kind == "float16" else W)
    scale = (rng.random(N) * 0.01 + 0.001).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    code = {"float32": 0, "float16": 1, "int8": 2}[kind]
    x = rng.standard_normal((24, K)).astype(np.float32)

    def linear(rows, threads, ahead=False, backward=False):
        rows = np.ascontiguousarray(rows)
        y = np.empty((rows.shape[0], N), dtype=np.float32)
        rc = lib.fa_test_linear(threads, code + (4 if ahead else 0) + (8 if backward else 0), N, K, rows.shape[0],
                                W.ctypes.data, scale.ctypes.data, bias.ctypes.data, rows.ctypes.data, y.ctypes.data)
        assert rc == 0
        return y

    try:
        alone = np.concatenate([linear(x[i:i + 1], 1) for i in range(len(x))])
        for ahead, backward in ((False, False), (False, True), (True, False), (True, True)):
            for threads in (1, 2, 3):
                for M in list(range(1, 21)) + [24]:
                    y = linear(x[:M], threads, ahead, backward)
                    assert np.array_equal(y.view(np.uint32), alone[:M].view(np.uint32)), \
                        (kind, threads, M, ahead, backward)
    finally:
        if previous is not None:
            lib.fa_set_amx_min_rows(previous)
    assert not np.array_equal(alone[0], alone[1])  # the rows differ: a mixed-up row would show


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic"]))
def test_stream_hints_ask_for_the_line_ahead_and_stay_in_the_share(isa):
    """A tile of several rows asks, once per cache line of its first panel, for
    the line kStreamAhead lines further on in each of its panels (64 lines,
    4096 bytes; 32 on the AMX target), running on into the next tile's panels,
    and never for a line at or past the end of its thread's share: the offsets
    StreamHints computes once per tile against that definition, for panels
    shorter and longer than the distance, on this machine's target and the
    portable one."""
    lib = build.test_library(None if isa == "default" else isa)
    lines = lib.fa_test_stream_ahead_lines()
    amx = isa == "default" and build.choose_target(None).name == "avx512amx"
    assert lines == (32 if amx else 64)
    _check_stream_hints(lib, lines * 64)


def _check_stream_hints(lib, ahead):
    import numpy as np

    asked = 0
    for step in (16, 32, 64):
        for steps in (1, 5, 18, 63, 64, 65, 100, 128, 256, 257, 512):
            pb = steps * step
            for nr in (1, 3, 8):
                for end in (nr * pb, nr * pb + 100, 2 * nr * pb + ahead, 5 * nr * pb + 3 * ahead):
                    out = np.empty(steps, dtype=np.int64)
                    assert lib.fa_test_stream_hints(pb, nr, steps, step, end, out.ctypes.data) == 0
                    for k in range(steps):
                        want = -1
                        if (k * step) % 64 == 0:
                            target = k * step + ahead
                            wraps = target // pb  # whole panels past the tile's, nr at a time
                            first = wraps * nr * pb + target - wraps * pb
                            if first + (nr - 1) * pb < end:
                                want = first
                        assert out[k] == want, (step, steps, nr, end, k, out[k], want)
                        asked += want >= 0
    assert asked > 1000  # the definition asks for lines in most of these tiles


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic-amx"]))  # generic-amx: the portable vectors
def test_attention_gives_the_bits_of_its_definition(isa):
    """attend computes 8 keys' scores at once (their lanes added as vectors
    after a transpose), the last few keys with the last one repeated, and the
    softmax's last exps as a vector: every output is the bits of the plain
    definition (one key at a time, fixed lane order; fa_test_attend's
    reference), for head widths with and without a partial 8, key counts
    around multiples of 8, a second segment (a tree row's branch), rows of
    stride D (head-major caches) or wider, and peaked and flat scores."""
    import ctypes
    import numpy as np

    lib = build.test_library(None if isa == "default" else isa)
    rng = np.random.default_rng(11)
    cases = 0
    for D in (4, 8, 16, 20, 32, 64, 72, 128):
        for n in (1, 2, 7, 8, 9, 15, 16, 17, 31, 40, 67):
            for n2 in (0, 1, 5, 9):
                ld = D if (n + n2) % 2 else 3 * D + 8
                scale = 4.0 if n % 3 == 0 else 0.3
                k, v = (rng.standard_normal((n, ld)).astype(np.float32) * scale for _ in range(2))
                k2, v2 = (rng.standard_normal((max(n2, 1), ld)).astype(np.float32) * scale for _ in range(2))
                q = rng.standard_normal(D).astype(np.float32) * scale
                out, ref = np.full(D, np.nan, np.float32), np.full(D, np.nan, np.float32)
                rc = lib.fa_test_attend(D, n, n2, ld, q.ctypes.data, k.ctypes.data, v.ctypes.data, k2.ctypes.data,
                                        v2.ctypes.data, out.ctypes.data, ref.ctypes.data)
                assert rc == 0
                assert np.isfinite(ref).all()
                assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (D, n, n2, ld)
                cases += 1
    assert cases == 8 * 11 * 4


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic-amx"]))
def test_attention_of_queries_together_gives_each_query_its_own_bits(isa):
    """The encoder's positions go through their sentence's keys and values
    together (attend_queries: up to 4 queries share each key's and value's
    loads): every output is the bits attend gives that query alone, for query
    counts around multiples of 4, head widths it groups (1-4 vectors) and those
    it does not, key counts around multiples of 8, and query rows of stride
    3 x C (the encoder's q/k/v rows)."""
    import numpy as np

    lib = build.test_library(None if isa == "default" else isa)
    rng = np.random.default_rng(12)
    cases = 0
    for D in (8, 16, 20, 32, 64):
        for n in (1, 7, 8, 9, 25, 40):
            for nq in (1, 3, 4, 5, 8, 9, 25):
                ld, q_ld = (D, 3 * 4 * D) if nq % 2 else (3 * D + 8, D)
                scale = 4.0 if nq % 3 == 0 else 0.3
                k, v = (rng.standard_normal((n, ld)).astype(np.float32) * scale for _ in range(2))
                q = rng.standard_normal((nq, q_ld)).astype(np.float32) * scale
                out, ref = np.full((nq, D), np.nan, np.float32), np.full((nq, D), np.nan, np.float32)
                rc = lib.fa_test_attend_queries(D, n, nq, q_ld, ld, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                                                out.ctypes.data, ref.ctypes.data)
                assert rc == 0
                assert np.isfinite(ref).all()
                assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (D, n, nq, ld, q_ld)
                cases += 1
    assert cases == 5 * 6 * 7


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic", "generic-amx"]))
def test_row_logsumexp_and_argmax_give_the_bits_of_their_definition(isa):
    """The log-softmax's logsumexp (exps summed as 8 lane partial sums) and
    greedy's argmax (the first maximum) give their definition's bits and index
    (fa_test_row_reductions' reference) for row lengths around multiples of 8,
    16 and 32, ties (the first wins), a maximum in the last few values, -inf
    columns and an all -inf row, on this machine's target and the portable ones."""
    import ctypes
    import numpy as np

    lib = build.test_library(None if isa == "default" else isa)
    rng = np.random.default_rng(5)
    cases = 0
    for n in (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 8424):  # maxima: 4 x 8 lanes at a time
        for kind in ("normal", "ties", "last", "neginf", "allneginf"):
            x = (rng.standard_normal(n) * 6).astype(np.float32)
            if kind == "ties":
                x[rng.integers(0, n, size=3)] = x.max() + 1.0
            elif kind == "last":
                x[-1] = x.max() + 2.0
            elif kind == "neginf":
                x[::3] = -np.inf
            elif kind == "allneginf":
                x[:] = -np.inf
            lse, ref_lse = ctypes.c_float(), ctypes.c_float()
            arg, ref_arg = ctypes.c_int(-1), ctypes.c_int(-2)
            assert lib.fa_test_row_reductions(n, x.ctypes.data, ctypes.byref(lse), ctypes.byref(arg),
                                              ctypes.byref(ref_lse), ctypes.byref(ref_arg)) == 0
            assert arg.value == ref_arg.value == int(np.argmax(x)), (n, kind)
            assert np.float32(lse.value).view(np.uint32) == np.float32(ref_lse.value).view(np.uint32), (n, kind)
            if np.isfinite(x).any():  # against float64
                exact = float(np.logaddexp.reduce(x.astype(np.float64)))
                assert abs(lse.value - exact) < 1e-4 * max(1.0, abs(lse.value))
            cases += 1
    assert cases == 75


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic"]))
def test_confidence_normaliser_is_its_definition_and_within_its_bound(isa):
    """A draft-length policy's confidence (a row's last score when outputs
    carry no scores) sums a coarse exp: the bits of its definition on this
    machine's target and the portable one, never below the logsumexp of
    scores and at most 0.06 above it, for row lengths around multiples of 64,
    peaked and flat rows, -inf columns and an all -inf row."""
    import ctypes
    import numpy as np

    lib = build.test_library(None if isa == "default" else isa)
    rng = np.random.default_rng(9)
    cases = 0
    for n in (1, 7, 63, 64, 65, 127, 128, 129, 200, 8424):
        for kind in ("peaked", "flat", "neginf", "allneginf"):
            x = (rng.standard_normal(n) * (8 if kind == "peaked" else 1)).astype(np.float32)
            if kind == "peaked":
                x[rng.integers(0, n)] = x.max() + 10
            elif kind == "neginf":
                x[::3] = -np.inf
                x[-1] = 1.0
            elif kind == "allneginf":
                x[:] = -np.inf
            coarse, ref = ctypes.c_float(), ctypes.c_float(np.nan)
            full, arg = ctypes.c_float(), ctypes.c_int()
            assert lib.fa_test_logsumexp_coarse(n, x.ctypes.data, ctypes.byref(coarse), ctypes.byref(ref)) == 0
            assert lib.fa_test_row_reductions(n, x.ctypes.data, ctypes.byref(full), ctypes.byref(arg),
                                              ctypes.byref(ctypes.c_float()), ctypes.byref(ctypes.c_int())) == 0
            assert np.float32(coarse.value).view(np.uint32) == np.float32(ref.value).view(np.uint32), (n, kind)
            if kind == "allneginf":
                assert coarse.value == -np.inf
            else:
                assert full.value - 1e-5 <= coarse.value <= full.value + 0.06, (n, kind, coarse.value, full.value)
            cases += 1
    assert cases == 40


@needs_native
def test_test_entry_points_are_only_in_the_test_library():
    """The pool's self-test and its lost-completion hook are built into the test
    library (csrc/testing/), not into the engine decoding loads."""
    from fairseq_aggressive.native import build, library

    lib = library()
    for name in ("fa_pool_selftest", "fa_pool_lose_next_count", "fa_set_eager_projection_bytes", "fa_test_linear",
                 "fa_test_attend", "fa_test_attend_queries", "fa_test_row_reductions", "fa_test_logsumexp_coarse",
                 "fa_test_realized",
                 "fa_test_stream_ahead_lines",
                 "fa_set_amx_min_rows", "fa_amx_products", "fa_test_amx_caller_shapes"):
        with pytest.raises(AttributeError):
            getattr(lib, name)
        assert getattr(build.test_library(), name) is not None
