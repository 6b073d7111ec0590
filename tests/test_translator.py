"""fairseq_aggressive.Translator: a hub model's generator built once and called
per sentence or per batch, with the hub's outputs (the shipped 9+3 model,
compared with fairseq's greedy through the hub)."""
import os
import threading

import pytest

from helpers import ROOT, fast_first, needs_native

MODEL = os.path.join(ROOT, "models", "uagec-9x3")


@pytest.fixture(scope="module")
def hub():
    from fairseq_aggressive import Translator

    return Translator.from_pretrained(MODEL).hub  # the hub model a Translator loads


@pytest.fixture(scope="module")
def lines():
    with open(os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), encoding="utf-8") as f:
        return [line.strip() for line in f][:16]


@pytest.fixture(scope="module")
def greedy(hub, lines):
    return [hub.translate(s, beam=1) for s in lines]  # fairseq's own, one sentence per call


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@needs_native
@pytest.mark.parametrize("settings", fast_first([{"decoding": "iad"}, {"decoding": "iad", "max_draft_len": 2},
                                                 {"decoding": "iad", "native_threads": 1}, {}]))
def test_one_sentence_per_call_gives_the_hubs_output(hub, lines, greedy, settings):
    from fairseq_aggressive import Translator

    t = Translator(hub, **settings)
    generator = t.generator
    t.translate(lines[0])
    before = _threads()
    assert [t.translate(s) for s in lines] == greedy
    assert t.generator is generator and _threads() <= before  # built once, no engine per call


@needs_native
def test_one_sentence_runs_as_one_row_where_the_decoding_runs_in_the_engines_batch(hub, lines, greedy, monkeypatch):
    """translate(s) of a decoding that runs in the engine's running batch goes through one
    row of it (passes without scores), never the generator; another decoding's goes
    through the generator; the same outputs."""
    from fairseq_aggressive import Translator

    iad, plain = Translator(hub, decoding="iad"), Translator(hub)
    assert iad.running_decoder() is not None and plain.running_decoder() is None

    def refused(*args, **kwargs):
        raise AssertionError("the generator's batch of one")

    monkeypatch.setattr(iad, "translate_static", refused)
    assert [iad.translate(s) for s in lines] == greedy
    calls = []
    static = plain.translate_static
    monkeypatch.setattr(plain, "translate_static", lambda batch: calls.append(batch) or static(batch))
    assert [plain.translate(s) for s in lines[:4]] == greedy[:4] and calls == [[s] for s in lines[:4]]
    with pytest.raises(TypeError, match="one sentence"):
        iad.translate(lines[:2])
    # what the running batch refuses goes to the generator, whose own answer (here its error) is the call's
    tight = Translator(hub, decoding="iad", min_len=5, max_len_a=0, max_len_b=2)
    with pytest.raises(ValueError, match="min_len cannot be larger than max_len"):
        tight.translate(lines[0])


@needs_native
def test_a_batch_gives_each_sentences_output_in_order(hub, lines):
    from fairseq_aggressive import Translator

    t = Translator(hub, decoding="iad")
    batch = lines[3:11][::-1]
    assert t.translate_static(batch) == hub.translate(batch, beam=1)  # fairseq's greedy, one batch
    assert t.translate_batch(batch, rows=3) == [hub.translate(s, beam=1) for s in batch]  # streamed, each alone
    assert t.translate_batch([]) == []
    with pytest.raises(TypeError, match="list of sentences"):
        t.translate_batch(lines[0])


@needs_native
def test_threads_calling_one_translator_take_turns(hub, lines, greedy):
    from fairseq_aggressive import Translator

    t = Translator(hub, decoding="iad")
    got = {}

    def work(k):
        got[k] = [t.translate(s) for s in lines]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(got[k] == greedy for k in range(3))


@needs_native
def test_translators_on_one_model_share_its_engine_weights(hub, lines, greedy):
    from fairseq_aggressive import Translator

    first = Translator(hub, decoding="iad", native_threads=1)
    second = Translator(hub, decoding="iad", native_threads=1)
    a, b = first.generator.native, second.generator.native
    assert a.handle != b.handle and a.weights_id == b.weights_id  # two engines, one copy
    got = {}

    def work(k, t):
        got[k] = [t.translate(s) for s in lines]

    threads = [threading.Thread(target=work, args=(k, t)) for k, t in enumerate((first, second))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got[0] == got[1] == greedy


def test_bad_settings_and_inputs_say_what_is_wrong(hub, tmp_path):
    from fairseq_aggressive import Translator

    with pytest.raises(ValueError, match="unknown generation setting.*decodng"):
        Translator(hub, decodng="iad")
    t = Translator(hub)
    limit = t._max_tokens[0]  # the 9+3's max_source_positions
    too_long = " ".join(["слово"] * (limit + 5))
    with pytest.raises(ValueError, match=rf"sentence 1 is \d+ tokens long after BPE; the model takes at most {limit}"):
        t.translate_batch(["добре", too_long])
    with pytest.raises(ValueError, match=rf"sentence 3 is \d+ tokens long after BPE; the model takes at most {limit}"):
        t.translate_batch(["добре"] * 3 + [too_long], rows=2)  # (static batches of 2: named in the whole list)
    streamed = Translator(hub, decoding="iad")
    with pytest.raises(ValueError, match=rf"sentence 2 is \d+ tokens long after BPE; the model takes at most {limit}"):
        streamed.translate_batch(["добре", "так", too_long, "ні"], rows=2)
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="no MODEL.json with source_lang and target_lang"):
        Translator.from_pretrained(str(tmp_path))
