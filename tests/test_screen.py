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

from helpers import GEC_MODEL, fast_first, needs_native, sample_lines

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


@pytest.mark.parametrize("decoding", fast_first(["iad", "greedy"]))
def test_streams_through_the_screen_give_each_sentences_own_output(test_lib, lines, decoding):
    from fairseq_aggressive.translator import Translator, load_hub

    t = Translator(load_hub(MODEL), decoding="iad", native_threads=2,
                   **({"max_draft_len": 0} if decoding == "greedy" else {}))
    before = _counts(test_lib)
    alone = [t.translate_static([s])[0] for s in lines]  # (scores: every logit, never the screen)
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
    alone = [t.translate_static([s])[0] for s in lines]
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


def _greedy(engine, src, max_len):
    """Each sentence's greedy tokens (to its EOS), by passes over the last token alone."""
    batch = engine.begin(src, max_len)
    out = [[] for _ in range(len(src))]
    live = list(range(len(src)))
    while live:
        rows = [[out[i][-1] if out[i] else engine.eos] for i in live]
        toks, _, _, done, _ = batch.step(live, rows, max_len, 1, 0.0, 1.0)
        for i, t, dn in zip(list(live), toks, done):
            out[i] += list(t)
            if dn or len(out[i]) >= max_len:
                live.remove(i)
    return out


def test_a_rows_last_score_is_taken_where_its_draft_stops():
    """Keeping only each row's last score (``scores="last"``: the confidence the loop asks for where
    a row may draft next) a pass emits the same tokens as with every score, NaN before the last, and
    the last within the coarse log-normaliser's bound of its exact score (over the screened
    projection's logits), for drafts accepted whole, rejected at their first token or later, and cut
    at an accepted EOS: another position's normaliser is off by far more (up to 3 in log-probability
    for the first position's)."""
    import random

    import numpy as np

    from fairseq_aggressive.native import NativeEngine
    from fairseq_aggressive.translator import load_hub
    from helpers import make_sample

    hub = load_hub(MODEL)
    model, d = hub.models[0], hub.tgt_dict
    engine = NativeEngine(model, d, threads=2)
    assert engine.eos == d.eos()
    src = make_sample([hub.encode(s).tolist() for s in sample_lines(24)], d.pad())["net_input"]["src_tokens"]
    max_len = 60
    ref = _greedy(engine, src, max_len)
    rng = random.Random(5)
    every, last = engine.begin(src, max_len), engine.begin(src, max_len)
    out = [[] for _ in range(len(ref))]
    live = [i for i in range(len(ref)) if len(ref[i]) < max_len]  # (rows that end by their EOS)
    kinds, gaps = set(), []
    while live:
        rows = []
        for i in live:
            rest, k = ref[i][len(out[i]):], rng.choice([0, 1, 3, 6, 40])
            draft = rest[:k] + ([7, 8] if k > len(rest) else [])  # past the EOS: cut there
            if draft and k <= len(rest) and rng.random() < 0.4:
                j = rng.randrange(len(draft))
                draft[j] = draft[j] + 1 if draft[j] + 1 < len(d) else 4  # rejected at j
            rows.append([out[i][-1] if out[i] else engine.eos] + draft)
        a = every.step(live, rows, max_len, 1, 0.0, 1.0)
        b = last.step(live, rows, max_len, 1, 0.0, 1.0, scores="last")
        for r, i in enumerate(list(live)):
            toks, full, part = list(a[0][r]), np.asarray(a[1][r]), np.asarray(b[1][r])
            assert toks == list(b[0][r]) and a[2][r] == b[2][r] and a[3][r] == b[3][r], (i, r)
            assert np.isnan(part[:-1]).all() and np.isfinite(part[-1]), part
            gaps.append(float(full[-1] - part[-1]))
            drafted, matched = len(rows[r]) - 1, a[2][r]
            kinds.add("eos" if toks[-1] == engine.eos and matched >= len(toks) else
                      "whole" if drafted and matched == drafted else "rejected" if drafted else "none")
            out[i] += toks
            if a[3][r]:
                live.remove(i)
    assert all(out[i] == ref[i] for i in range(len(ref)) if len(ref[i]) < max_len)
    assert kinds >= {"eos", "whole", "rejected", "none"}, kinds
    assert min(gaps) >= -1e-4 and max(gaps) <= 0.1, (min(gaps), max(gaps))
