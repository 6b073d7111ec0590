"""Whole inputs through the engine's running batch on the shipped 9+3
(fairseq_aggressive/streaming): every sentence's output equals its batch-1
output (``Translator.translate``'s, fairseq's greedy) at every row count and
number of lanes, in float32 and int8, for IAD and greedy; decodings the running batch does not
run go in static batches; ``fairseq-aggressive-translate`` from a file and
from standard input, its refusals, and nothing half-written."""
import os

import pytest

from helpers import GEC_MODEL, fast_first, needs_native, python, sample_lines, tool

pytestmark = needs_native

MODEL = GEC_MODEL


@pytest.fixture(scope="module")
def lines():
    return sample_lines(120)


@pytest.fixture(scope="module")
def hub():
    from fairseq_aggressive.translator import load_hub

    return load_hub(MODEL)


@pytest.mark.parametrize("settings", fast_first([dict(decoding="iad"), dict(decoding="iad", max_draft_len=0),
                                                 dict(decoding="iad", inference_precision="int8"),
                                                 dict(decoding="iad", draft_cost="off", max_draft_len=4)]),
                         ids=["iad", "greedy", "iad-int8", "iad-fixed"])
def test_streamed_outputs_are_each_sentences_own(hub, lines, settings):
    from fairseq_aggressive.streaming import stream
    from fairseq_aggressive.translator import Translator

    from fairseq_aggressive.translator import load_hub

    int8 = settings.get("inference_precision") == "int8"
    t = Translator(load_hub(MODEL) if int8 else hub, **settings)  # (int8 quantizes its hub model in place)
    assert t.running_decoder() is not None
    alone = [t.translate_static([s])[0] for s in lines]  # batch 1, the generator's loop
    if not int8:  # equal to fairseq's own greedy (spot check); int8: its int8 model's greedy
        fairseq = Translator(hub)
        assert [fairseq.translate(s) for s in lines[:10]] == alone[:10]
    # lanes: one per engine thread (default), one, and more than this machine's cores
    for rows, lanes in ((1, None), (7, None), (32, None), (128, None), (7, 1), (32, 1), (32, 3)):
        assert list(stream(t, iter(lines), rows, lanes=lanes)) == alone, (rows, lanes)
    shuffled = lines[::-1]  # another arrival order
    assert t.translate_batch(shuffled, rows=16) == alone[::-1]


def test_a_lane_decodes_as_many_rows_as_its_caches_hold(hub, lines, monkeypatch):
    """Where the weights are small enough for lanes, a lane decodes at most as many rows as keep
    their attention caches within LANE_CACHE_BYTES (at least MIN_LANE_ROWS); the stream's other
    sentences wait to join, and every output is still the sentence's own."""
    from fairseq_aggressive.native import engine as E
    from fairseq_aggressive.native.running import RunningBatch
    from fairseq_aggressive.streaming import stream
    from fairseq_aggressive.translator import Translator

    t = Translator(hub, decoding="iad")
    eng = t.running_decoder().engine
    per_row = 3 * 2 * 128 * 4 * E.ROW_POSITIONS  # (the 9+3: 3 decoder layers of width 128)
    assert eng.lane_rows() == E.LANE_CACHE_BYTES // per_row == 16
    most = []
    run = RunningBatch.run

    def counted(self, *a, **k):
        most.append(self.active)
        return run(self, *a, **k)

    monkeypatch.setattr(RunningBatch, "run", counted)
    monkeypatch.setattr(E, "LANE_CACHE_BYTES", per_row * 3)
    monkeypatch.setattr(E, "MIN_LANE_ROWS", 2)
    assert eng.lane_rows() == 3
    alone = [t.translate_static([s])[0] for s in lines[:40]]
    most.clear()
    assert list(stream(t, lines[:40], 32)) == alone
    assert max(most) == 3
    monkeypatch.setattr(E, "MIN_LANE_ROWS", 8)
    assert eng.lane_rows() == 8
    monkeypatch.setattr(E, "LANE_WEIGHT_BYTES", eng.pass_weight_bytes)  # (weights whose reads more rows share)
    assert eng.lane_rows() is None
    most.clear()
    assert list(stream(t, lines[:40], 32)) == alone
    assert max(most) > 8


def test_a_stream_takes_the_streams_lanes(hub, monkeypatch):
    """A stream deals its rows by the engine's rule for streams (NativeEngine.default_lanes with
    stream=True), which may give lanes where a static batch's rule gives none."""
    from fairseq_aggressive.native import engine as E
    from fairseq_aggressive.runtime import cpu_features
    from fairseq_aggressive.translator import Translator

    dec = Translator(hub, decoding="iad").running_decoder()
    eng = dec.engine
    if eng.threads < 2:
        pytest.skip("one engine thread: one lane either way")
    monkeypatch.setattr(E, "LANE_WEIGHT_BYTES", eng.pass_weight_bytes)
    monkeypatch.setattr(cpu_features, "last_level_cache_bytes",
                        lambda: (eng.pass_weight_bytes + 1) * E.STREAM_LANE_CACHE_SHARE)
    assert eng.default_lanes() == 1 and dec.lanes(32) == eng.threads
    monkeypatch.setattr(cpu_features, "last_level_cache_bytes", lambda: 0)
    assert dec.lanes(32) == 1


def test_its_encoding_and_decoding_are_the_hubs(hub, lines):
    """The running decoder's own lookup of source ids and join of output symbols give the
    hub's encode() and decode() exactly: the sample, odd whitespace, unknown words, <unk> and
    EOS among the tokens; the second time from the ids it kept of each word (the hub's BPE
    is subword-nmt's, which segments each space-separated word on its own)."""
    import torch

    from fairseq_aggressive.translator import Translator

    dec = Translator(hub, decoding="iad").running_decoder()
    texts = lines + ["", "  a  b\t c ", "ЙЖ \u2003 x", "<unk> unknownwordxyz Ωmega", "a\u00a0b", "\x1c x \x1f",
                     "a\r\nb \r\n", "\r\n x\ty  \r", "unknownwordxyz unknownwordxyz"]
    for round in range(2):
        for s in texts:
            ids = hub.encode(s).tolist()
            assert dec.encode(s).tolist() == ids, (round, s)
            out = ids[:-1] + [hub.tgt_dict.unk(), hub.tgt_dict.eos()]
            assert dec.finish(out) == hub.decode(torch.tensor(out)), s
        assert "unknownwordxyz" in dec._words  # (the words' ids were kept)


def test_a_prepared_sentences_copy_source_is_the_drafters(hub, lines):
    """prepare() gives the hub's source ids and the copy source the drafter copies from
    (its source ids in the target dictionary, padding left out), also where the two
    dictionaries differ (a source-to-target id map)."""
    import types

    import torch

    from fairseq_aggressive.translator import Translator

    dec = Translator(hub, decoding="iad").running_decoder()
    pad = dec.drafter.pad
    for s in lines[:20]:
        ids = hub.encode(s)
        p = dec.prepare(s)
        assert p.source == ids.tolist() and p.copy == [t for t in ids.tolist() if t != pad], s
    n = len(hub.src_dict)
    to_tgt = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    to_tgt[5] = pad  # a source word the target dictionary lacks
    dec.drafter = types.SimpleNamespace(src_to_tgt=to_tgt, pad=pad)
    for s in lines[:20] + ["a b c"]:
        ids = hub.encode(s)
        ids[0] = 5
        mapped = to_tgt[ids]
        assert dec.prepared(ids).copy == mapped[mapped != pad].tolist(), s
        assert dec.prepared(ids.tolist()).copy == mapped[mapped != pad].tolist(), s


def test_other_decodings_go_in_static_batches(hub, lines):
    from fairseq_aggressive.streaming import stream
    from fairseq_aggressive.translator import Translator

    t = Translator(hub)  # fairseq's beam search (beam 1): no running batch
    assert t.running_decoder() is None
    got = list(stream(t, lines[:20], rows=8))
    want = t.translate_static(lines[:8]) + t.translate_static(lines[8:16]) + t.translate_static(lines[16:20])
    assert got == want


def _cli(*args, stdin=None):
    """The console script as a user runs it (forked from the tests' warm interpreter: helpers.python)."""
    return python([tool("fairseq-aggressive-translate"), MODEL, *args], input=stdin, timeout=300)


@pytest.mark.slow  # (the command, twice)
def test_the_translate_command(hub, lines, tmp_path):
    from fairseq_aggressive.translator import Translator

    t = Translator(hub, decoding="iad")
    text = lines[:40] + [""] + lines[40:60]
    want = [t.translate_static([s])[0] for s in text]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(text) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    proc = _cli("-i", str(src), "-o", str(out), "--rows", "8", "--progress", "on")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == want
    assert "sentences" in proc.stderr  # the progress bar
    piped = _cli("--decoding", "greedy", "--rows", "3", "--lanes", "3", stdin="\n".join(text[:12]) + "\n")
    assert piped.returncode == 0, piped.stderr
    greedy = Translator(hub, decoding="iad", max_draft_len=0)
    assert piped.stdout.split("\n")[:-1] == [greedy.translate_static([s])[0] for s in text[:12]]
    assert "sentences" not in piped.stderr  # not a terminal: no bar


@pytest.mark.slow  # (the command, several times over)
def test_the_translate_command_refuses_without_writing_half(lines, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines[:5] + [" ".join(["слово"] * 2000)] + lines[5:9]) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    proc = _cli("-i", str(src), "-o", str(out))
    assert proc.returncode == 1 and "line 6 is" in proc.stderr and "tokens long after BPE" in proc.stderr
    assert not out.exists() and os.listdir(tmp_path) == ["in.txt"]
    missing = _cli("-i", str(tmp_path / "nowhere.txt"))
    assert missing.returncode == 2 and "nowhere.txt" in missing.stderr
    rows = _cli("--rows", "0", stdin="a\n")
    assert rows.returncode == 2 and "--rows must be >= 1" in rows.stderr
    lanes = _cli("--lanes", "0", stdin="a\n")
    assert lanes.returncode == 2 and "--lanes must be >= 1" in lanes.stderr
