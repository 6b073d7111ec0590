"""The screened projection (fairseq_aggressive/native/csrc/model/screen.h): a
float model's passes that keep no scores (streams, the server) compute the
float logits only where the int8 screen's bound says the maximum could be.
Streams through it give every sentence its own greedy output (the full
projection's, which translate() uses with its scores), at 1, 8 and 32 rows,
greedy and IAD; the screen computes about two panels a position; a pass that
keeps scores never uses it; and a bound cut to nothing (a mutant) changes
outputs, so these tests can fail."""
import ctypes

import pytest

from helpers import GEC_MODEL, needs_native, sample_lines

pytestmark = needs_native

MODEL = GEC_MODEL


@pytest.fixture(scope="module")
def lines():
    return sample_lines(120)


@pytest.fixture
def test_lib(monkeypatch):
    from fairseq_aggressive.native import build, engine as native_engine

    monkeypatch.setattr(native_engine, "library", build.test_library)
    return build.test_library()


def _counts(lib):
    out = (ctypes.c_int64 * 3)()
    lib.fa_screen_counts(out)
    return list(out)


def _set_screen(lib, translator, on, slack, rows):
    """The screen's switch and bound factor on every engine a stream of ``rows`` rows uses."""
    dec = translator.running_decoder()
    for e in [dec.engine] + dec.engine.lanes(dec.lanes(rows)):
        lib.fa_set_screen(e.handle, int(on), slack)


@pytest.mark.parametrize("decoding", ["greedy", "iad"])
def test_streams_through_the_screen_give_each_sentences_own_output(test_lib, lines, decoding):
    from fairseq_aggressive.translator import Translator, load_hub

    t = Translator(load_hub(MODEL), decoding="iad", native_threads=2,
                   **({"max_draft_len": 0} if decoding == "greedy" else {}))
    before = _counts(test_lib)
    alone = [t.translate(s) for s in lines]  # (scores: every logit, never the screen)
    assert _counts(test_lib) == before
    for rows in (1, 8, 32):
        assert t.translate_batch(lines, rows=rows) == alone, rows
    # one running batch on both threads: a pass's rows screened by the pool's threads at once
    assert t.translate_batch(lines, rows=32, lanes=1) == alone
    rows_screened, panels, whole = (b - a for a, b in zip(before, _counts(test_lib)))
    assert rows_screened >= 4 * len(lines) * 10  # (every streamed position: about 25 a sentence)
    assert panels <= 3 * rows_screened and whole <= rows_screened // 100  # (the special columns' panel and one)


def test_a_bound_cut_to_nothing_changes_outputs(test_lib, lines):
    """The mutant keeps only the screen's own maximum (and the special columns):
    where the int8 screen and the float logits disagree on the maximum, the
    output changes.  With the screen off the outputs are the full projection's."""
    from fairseq_aggressive.translator import Translator, load_hub

    t = Translator(load_hub(MODEL), decoding="iad", max_draft_len=0)
    alone = [t.translate(s) for s in lines]
    try:
        _set_screen(test_lib, t, True, 0.0, 8)
        cut = t.translate_batch(lines, rows=8)
        assert sum(a != b for a, b in zip(cut, alone)) >= 1
        _set_screen(test_lib, t, False, 1.0, 8)
        before = _counts(test_lib)
        assert t.translate_batch(lines, rows=8) == alone
        assert _counts(test_lib) == before  # (off: not one row screened)
    finally:
        _set_screen(test_lib, t, True, 1.0, 8)
