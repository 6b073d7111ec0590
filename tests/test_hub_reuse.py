"""A hub model's translate() builds a generator per call (fairseq's hub API): the
task hands the calling thread's last aggressive generator back while the model's
tensors and every setting are the same, and nothing of a generator it no longer
uses stays alive (a service calling translate() per sentence keeps one engine per
thread, not one per call).  The shipped 9+3 model, its output compared with
fairseq's greedy."""
import copy
import gc
import os
import threading
import weakref

import pytest
import torch
from omegaconf import open_dict

from helpers import ROOT, needs_native, python

MODEL = os.path.join(ROOT, "models", "uagec-9x3")


@pytest.fixture(scope="module")
def hub():
    from fairseq.models.transformer import TransformerModel

    import fairseq_aggressive  # noqa: F401

    m = TransformerModel.from_pretrained(MODEL, "model.pt", MODEL, bpe="subword_nmt",
                                         bpe_codes=os.path.join(MODEL, "bpe.codes"),
                                         source_lang="src", target_lang="tgt")
    return m.eval()


def _sample_lines():
    with open(os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), encoding="utf-8") as f:
        return [line.strip() for line in f]


@pytest.fixture(scope="module")
def lines():
    return _sample_lines()[:12]


def _args(hub, **values):
    """What hub.translate(..., **values) hands the task: a fresh copy of the generation config."""
    args = copy.deepcopy(hub.cfg.generation)
    with open_dict(args):
        args.beam = 1
        for k, v in values.items():
            setattr(args, k, v)
    return args


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@needs_native
def test_the_same_settings_get_the_same_generator(hub):
    first = hub.task.build_generator(hub.models, _args(hub, decoding="iad"))
    again = hub.task.build_generator(hub.models, _args(hub, decoding="iad"))
    assert again is first
    other = hub.task.build_generator(hub.models, _args(hub, decoding="iad", max_len_b=50))
    assert other is not first
    assert hub.task.build_generator(hub.models, _args(hub, decoding="iad", max_draft_len=2)) is not other
    # a generator the thread no longer uses is gone, with its engine
    gone = weakref.ref(first)
    del first, again, other
    gc.collect()
    assert gone() is None
    # a caller-supplied argument of its own (another engine's weights): always a new generator
    shared = hub.task.build_generator(hub.models, _args(hub, decoding="iad"))
    assert hub.task.build_generator(hub.models, _args(hub, decoding="iad"),
                                    native_share=shared.native) is not shared


@needs_native
def test_translate_per_sentence_keeps_one_engine(hub, lines):
    hub.translate(lines[0], beam=1, decoding="iad")
    before = _threads()
    outs = [hub.translate(s, beam=1, decoding="iad") for s in lines * 3]
    assert _threads() <= before  # one engine and its pool for every call of this thread
    assert outs[:len(lines)] == hub.translate(lines, beam=1)  # fairseq's greedy


@needs_native
def test_each_thread_gets_its_own(hub, lines):
    expected = hub.translate(lines, beam=1)
    got, seen = {}, {}

    def work(k):
        got[k] = [hub.translate(s, beam=1, decoding="iad") for s in lines]
        seen[k] = hub.task._last.built[1]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[k] == expected for k in range(3))
    assert len({id(g) for g in seen.values()}) == 3


@needs_native
def test_weights_changed_in_place_are_decoded(hub, lines):
    model = hub.models[0]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    before = hub.translate(lines, beam=1, decoding="iad")
    try:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # as an optimizer's step would: in place, each tensor's version moves on
            for p in model.decoder.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.abs().mean())
        after = hub.translate(lines, beam=1, decoding="iad")
        assert after == hub.translate(lines, beam=1)  # the changed model's greedy output
        assert after != before
    finally:
        model.load_state_dict(saved)
    assert hub.translate(lines, beam=1, decoding="iad") == before


@needs_native
@pytest.mark.slow  # (a whole script)
def test_hub_latency_script(tmp_path):
    import re
    import sys

    from helpers import run

    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in _sample_lines()[:4]), encoding="utf-8")
    import importlib.util

    ct2 = ["ct2-best"] if importlib.util.find_spec("ctranslate2") else []
    out = run([sys.executable, "scripts/diagnostics/hub_latency.py", MODEL, "--input", str(src),
               "--sentences", "4", "--modes", "greedy", "iad", "translator:iad", *ct2,
               "--json", str(tmp_path / "hub.json")]).stdout
    assert re.search(r"^greedy: [\d.]+ ms per sentence \(decoding [\d.]+, the rest [\d.]+\); 1\.00x greedy; "
                     r"the same output as greedy in 4/4$", out, re.M), out
    assert re.search(r"^iad: .*; the same output as greedy in 4/4$", out, re.M), out
    assert re.search(r"^translator:iad: [\d.]+ ms per sentence \(decoding [\d.]+, the rest [\d.]+\); [\d.]+x greedy; "
                     r"the same output as greedy in 4/4$", out, re.M), out
    if ct2:  # CTranslate2's fastest configuration, named
        assert re.search(r"^ct2-best \(\w+, \d+ threads?\): [\d.]+ ms per sentence; "
                         r"[\d.]+x greedy; the same output as greedy in \d/4$", out, re.M), out
    before, after = map(int, re.search(r"threads of the process: (\d+) after the warm-up, (\d+) after", out).groups())
    assert after == before
    # --json: what it printed, as a result the hub-latency table shows
    import json

    from fairseq_aggressive.bench.results import stored
    from fairseq_aggressive.bench.tables import TABLES

    res = json.loads((tmp_path / "hub.json").read_text())
    assert res["command"].startswith("python scripts/diagnostics/hub_latency.py ") and res["sentences"] == 4
    for m, row in res["modes"].items():
        assert f"{m}: {row['mean_ms_per_sentence']:.2f} ms per sentence" in out or m == "ct2-best", (m, out)
        assert row["identical_to_greedy"] == (4 if m != "ct2-best" else row["identical_to_greedy"])
    lines = TABLES["hub-latency"]([stored(res, "9+3")])
    assert lines[2].startswith("| 9+3 | ") and "greedy (hub)'s: translator:iad 4/4" in lines[-1], lines
    bad = python([sys.executable, "scripts/diagnostics/hub_latency.py", MODEL, "--input", str(src),
                  "--modes", "iad", "iad"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "distinct --modes" in bad.stderr
