"""AMX tiles for the int8 products (the avx512amx target): the same bits as
the vector tiles.  On every CPU the tile code runs on tiles emulated in
software (the test-only generic-amx target, shape checks included); on a CPU
with AMX the real target runs the same checks.  Where the tiles cannot run,
the avx512amx library runs its vector tiles, and a target that cannot be built
gives way to the next one."""
import logging

import numpy as np
import pytest

from fairseq_aggressive.native import NativeEngine, NativeUnavailable, build
from helpers import NATIVE_REASON, needs_native

# the emulated tiles (generic-amx: a library of their own to build) in the slow tier
AMX_TARGETS = [pytest.param(t, marks=pytest.mark.slow) if t == "generic-amx" else t
               for t in ("generic-amx", "avx512amx") if NATIVE_REASON is None and t in build.runnable_targets()]
AMX_FLAGS = {"amx_tile", "amx_int8"}


def _linear(lib, W, scale, bias, x, threads):
    y = np.empty((x.shape[0], W.shape[0]), dtype=np.float32)
    x = np.ascontiguousarray(x)
    rc = lib.fa_test_linear(threads, 2, W.shape[0], W.shape[1], x.shape[0], W.ctypes.data, scale.ctypes.data,
                            bias.ctypes.data, x.ctypes.data, y.ctypes.data)
    assert rc == 0
    return y


@needs_native
@pytest.mark.parametrize("isa", AMX_TARGETS)
def test_amx_tiles_give_the_vector_tiles_bits(isa):
    """Products of 1-64 rows (one to four row blocks of up to 16: alone, in
    pairs that share each B tile, overlapping where the rows do not divide
    evenly), widths that end in a partial panel and a partial group of 4
    panels, depths that fill whole tiles of 64 k or end inside one, 1-3
    threads: every output's bits are the default target's (its vector tiles),
    whether the tiles start at 1 row, at 2 or never; and the tiles do run."""
    lib = build.test_library(isa)
    state = lib.fa_amx_state()
    if state != 1:
        pytest.skip(f"AMX tiles are not usable in this process (fa_amx_state {state})")
    ref = build.test_library()
    rng = np.random.default_rng(11)
    previous = lib.fa_set_amx_min_rows(2)
    try:
        for N, K in ((203, 72), (64, 64), (40, 200)):
            W = rng.integers(-127, 128, size=(N, K), dtype=np.int8)
            scale = (rng.random(N) * 0.01 + 0.001).astype(np.float32)
            bias = rng.standard_normal(N).astype(np.float32)
            x = rng.standard_normal((64, K)).astype(np.float32)
            x[3] = 0.0  # a row of zeros (its scale is the fallback's)
            want = _linear(ref, W, scale, bias, x, 1)
            for min_rows in (1, 2, 65):
                lib.fa_set_amx_min_rows(min_rows)
                for threads in (1, 2, 3):
                    for M in list(range(1, 18)) + [24, 29, 31, 32, 33, 40, 47, 48, 49, 63, 64]:
                        before = lib.fa_amx_products()
                        y = _linear(lib, W, scale, bias, x[:M], threads)
                        assert np.array_equal(y.view(np.uint32), want[:M].view(np.uint32)), (N, K, min_rows, threads, M)
                        assert (lib.fa_amx_products() > before) == (M >= min_rows), (min_rows, M)
    finally:
        lib.fa_set_amx_min_rows(previous)
    assert not np.array_equal(want[0], want[1])  # the rows differ: a mixed-up row would show


@needs_native
@pytest.mark.parametrize("isa", AMX_TARGETS)
def test_a_product_leaves_the_calling_threads_tile_shapes_as_it_found_them(isa):
    """The calling thread is the application's: other code on it (torch's own
    AMX kernels) may hold tile shapes between its calls.  After a product on
    the tiles the thread has its shapes back, or none if it had none, on a
    pool of 1 or 3 threads."""
    lib = build.test_library(isa)
    if lib.fa_amx_state() != 1:
        pytest.skip("AMX tiles are not usable in this process")
    for shaped in (1, 0):
        for threads in (1, 3):
            assert lib.fa_test_amx_caller_shapes(shaped, 12, threads) == 1, (shaped, threads)


@needs_native
def test_targets_without_amx_tiles_say_so():
    """The vector targets report no tiles; the test-only hooks are refused there."""
    lib = build.library()
    if lib.fa_isa().decode() != "avx512amx":
        assert lib.fa_amx_state() == 0
    plain = build.test_library()
    if plain.fa_isa().decode() != "avx512amx":
        assert plain.fa_set_amx_min_rows(3) == -1 and plain.fa_test_amx_caller_shapes(1, 5, 1) == -1


@needs_native
@pytest.mark.parametrize("isa", AMX_TARGETS)
def test_an_int8_model_decodes_on_the_tiles_with_the_vector_tiles_bits(isa, monkeypatch):
    """An int8 model (its encoder's and passes' products of several rows on the
    tiles) decodes with the default target's bits: IAD and greedy, batch 1
    and 4."""
    import random

    from fairseq_aggressive.native import engine as native_engine
    from fairseq_aggressive.runtime.quantization import quantize_int8
    from helpers import make_model, make_task
    from test_equivalence import random_sources
    from test_native import _decode, _same_bits

    monkeypatch.setattr(native_engine, "library", build.test_library)  # its counter of tile products
    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=5, encoder_attention_heads=2, decoder_attention_heads=2))
    rows = random_sources(random.Random(7), 16, len(d), d.eos(), repeat=True)
    amx = NativeEngine(model, d, isa=isa)
    if amx.lib.fa_amx_state() != 1:
        pytest.skip("AMX tiles are not usable in this process")
    previous = amx.lib.fa_set_amx_min_rows(2)  # a pass's few positions on the tiles too
    try:
        before = amx.lib.fa_amx_products()
        for bsz, cap in ((1, None), (4, 0)):
            ref, _ = _decode(model, task, rows, bsz, max_len_b=30, max_draft_len=cap)
            out, _ = _decode(model, task, rows, bsz, native=amx, max_len_b=30, max_draft_len=cap)
            _same_bits(ref, out)
        assert amx.lib.fa_amx_products() > before
    finally:
        amx.lib.fa_set_amx_min_rows(previous)


@pytest.fixture
def fresh_loader(monkeypatch):
    """A loader that has loaded nothing yet and reads the CPU as having AMX."""
    flags = build._cpu_flags() | AMX_FLAGS
    monkeypatch.setattr(build, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.delenv(build.ISA_ENV, raising=False)


@needs_native
@pytest.mark.skipif("avx512vnni" not in build.runnable_targets() or "avx512amx" in build.runnable_targets(),
                    reason="needs a CPU with AVX-512 VNNI and without AMX")
def test_the_amx_library_without_tiles_runs_its_vector_tiles(fresh_loader, caplog):
    """The avx512amx library on a CPU without AMX (its cpuinfo flags faked):
    one warning, and an int8 model decodes with the bits of the avx512vnni
    target (its products of several rows go to the vector tiles)."""
    from fairseq_aggressive.runtime.quantization import quantize_int8
    from helpers import make_model, make_task
    from test_equivalence import random_sources
    from test_native import _decode, _same_bits

    import random

    task = make_task()
    d = task.target_dictionary
    model = quantize_int8(make_model(task, seed=5, encoder_attention_heads=2, decoder_attention_heads=2))
    rows = random_sources(random.Random(4), 12, len(d), d.eos(), repeat=True)
    with caplog.at_level(logging.WARNING, logger="fairseq_aggressive"):
        amx = NativeEngine(model, d, isa="avx512amx")
    assert amx.isa == "avx512amx" and amx.lib.fa_amx_state() == -1
    warned = [r.getMessage() for r in caplog.records if "AMX tiles" in r.getMessage()]
    assert len(warned) == 1 and "VNNI tiles (the same results)" in warned[0], warned
    vnni = NativeEngine(model, d, isa="avx512vnni")
    ref, _ = _decode(model, task, rows, 4, native=vnni, max_len_b=30)
    out, _ = _decode(model, task, rows, 4, native=amx, max_len_b=30)
    _same_bits(ref, out)


@needs_native
@pytest.mark.skipif("avx512vnni" not in build.runnable_targets(), reason="needs a CPU with AVX-512 VNNI")
def test_an_amx_target_that_cannot_load_gives_way_to_the_next(fresh_loader, monkeypatch, caplog):
    """The best target is avx512amx (cpuinfo faked) but its library cannot be
    had (a compiler without AMX, nothing packaged): one warning, the
    avx512vnni engine loads.  Asked for by name, the failure is the error."""
    locate = build._locate

    def no_amx(target):
        if target.name == "avx512amx":
            raise NativeUnavailable("building the native engine failed: unrecognized option '-mamx-tile'",
                                    setup=True)
        return locate(target)

    monkeypatch.setattr(build, "_locate", no_amx)
    assert build.choose_target().name == "avx512amx"
    with caplog.at_level(logging.WARNING, logger="fairseq_aggressive"):
        lib = build.library()
    assert lib.fa_isa().decode() == "avx512vnni"
    warned = [r.getMessage() for r in caplog.records if "avx512amx" in r.getMessage()]
    assert len(warned) == 1 and "-mamx-tile" in warned[0] and "the next one" in warned[0], warned
    assert build.library() is lib  # once per process
    with pytest.raises(NativeUnavailable, match="-mamx-tile"):
        build.library("avx512amx")


@needs_native
@pytest.mark.skipif("avx512vnni" not in build.runnable_targets(), reason="needs a CPU with AVX-512 VNNI")
def test_when_no_target_can_be_had_an_amx_cpu_says_so_once(fresh_loader, monkeypatch, caplog):
    """The best target is avx512amx (cpuinfo faked) and no target can be had
    (a compiler that fails, nothing packaged): the loader warns of nothing
    itself (no "the next one loads" that then does not), the error is the
    next target's, and the caller's one warning says why."""
    def nothing_builds(target):
        raise NativeUnavailable(f"building the native engine failed ({target.name})", setup=True)

    monkeypatch.setattr(build, "_locate", nothing_builds)
    with caplog.at_level(logging.WARNING, logger="fairseq_aggressive"):
        with pytest.raises(NativeUnavailable, match=r"failed \(avx512vnni\)"):
            build.library()
    assert [r.getMessage() for r in caplog.records] == []


@needs_native
@pytest.mark.skipif("avx512amx" in build.runnable_targets(), reason="this CPU has AMX")
def test_asking_for_amx_on_a_cpu_without_it_names_what_is_missing():
    with pytest.raises(NativeUnavailable, match=r"target avx512amx needs CPU features this CPU lacks \(.*amx_int8"):
        build.library("avx512amx")
