"""The shipped UA-GEC models (models/uagec-9x3, the demo's, and the smaller
models/uagec-3x2 of the same recipe, vocabulary and BPE) and the demo that
decodes the first (`make demo` = scripts/demo.py): each model loads with stock
fairseq, copies (IAD accepts long drafts on it) and IAD equals greedy on it; the
demo runs end to end; so does the translation demo (`make demo-mt` =
scripts/demo_mt.py)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, compare

DEMO = os.path.join(ROOT, "scripts", "demo.py")

# minutes: the shipped 9+3 model decodes the sample's test sentences, the demo runs end to end
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_and_data(tmp_path_factory):
    """The demo's module and the sample's test split binarized as it binarizes it for
    the shipped models (one BPE and vocabulary for all: checked below), made once."""
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    data, _, _ = demo.shipped_data(tmp_path_factory.mktemp("shipped"))
    return demo, data


@pytest.mark.parametrize("name", ["uagec-9x3", "uagec-3x2"])
def test_shipped_model_is_usable_and_iad_equals_greedy(demo_and_data, name):
    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    import fairseq_aggressive  # noqa: F401
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator

    demo, data = demo_and_data
    mdir = Path(ROOT) / "models" / name
    meta = json.loads((mdir / "MODEL.json").read_text())
    for f in ("dict.src.txt", "dict.tgt.txt", "bpe.codes"):  # the demo's data fits every shipped UA-GEC model
        assert (mdir / f).read_bytes() == (demo.SHIPPED / f).read_bytes(), f
    state = torch.load(mdir / "model.pt", map_location="cpu", weights_only=False)
    assert "last_optimizer_state" not in state
    assert all(v.dtype == torch.float16 for v in state["model"].values() if v.is_floating_point())
    ckpt = mdir / "model.pt"
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    assert next(model.parameters()).dtype == torch.float32  # float16 storage, float32 model
    # tied embeddings are stored once and counted once
    assert sum({p.data_ptr(): p.numel() for p in model.state_dict().values()}.values()) == meta["parameters"]
    assert os.path.getsize(mdir / "model.pt") < 2.2 * meta["parameters"]
    d = task.target_dictionary
    task.load_dataset("test")
    ds = task.dataset("test")
    for bsz, n in ((1, 40), (8, 80)):
        # uncapped drafts verified as made: how much the model copies; and IAD's default (on the
        # native engine: the lengths of its draft-length budget)
        gen = build_generator([model], d, InputCopyDrafter(d, d), max_len_a=1.2, max_len_b=10,
                                  max_draft_len=1024, draft_cost="off")
        default = build_generator([model], d, InputCopyDrafter(d, d), max_len_a=1.2, max_len_b=10)
        ref = SequenceGenerator([model], d, beam_size=1, max_len_a=1.2, max_len_b=10)
        cmp = None
        for i in range(0, n, bsz):
            sample = ds.collater([ds[j] for j in range(i, i + bsz)])
            greedy = ref.generate([model], sample)
            for g in (gen, default):
                cmp = compare(model, sample, greedy, g.generate([model], sample), cmp)
        assert cmp.ok() and cmp.identical == cmp.total == 2 * n, cmp
        # a usable GEC model copies most of its input: IAD accepts long drafts (on these 40
        # sentences at batch 1: 2.61 tokens per pass on the 9+3; a model that does not copy gives
        # about 1)
        assert gen.stats.as_dict()["mean_tokens_per_pass"] >= 2.4, gen.stats.summary()


@pytest.mark.e2e
def test_demo_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, DEMO, "--work", str(tmp_path),
                           "--sentences", "30", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "machine: " in out and "native bf16" in out
    assert "IAD output identical to greedy: 30/30 sentences" in out
    assert "speedup over beam 5" in out and "aggressive decoding (iad): 300 sentences" in out
    from fairseq_aggressive.native import available

    if available() is None:  # the int8 copy on the engine: IAD bit for bit its greedy
        assert "| iad-int8 |" in out and "| greedy-native-int8 |" in out
        assert re.search(r"IAD on the int8 model: [\d.]+ ms per sentence(, [\d.]+x ct2[\w-]*)?; "
                         r"identical to that model's greedy on the engine: 30/30 sentences", out), out[-2000:]


@pytest.mark.e2e
def test_translation_demo_end_to_end(tmp_path):
    """make demo-mt: the shipped en-de student with its drafters on the bundled sample; every
    drafted output is greedy's, and the feature drafter accepts several tokens per pass."""
    import re

    demo_mt = os.path.join(ROOT, "scripts", "demo_mt.py")
    proc = subprocess.run([sys.executable, demo_mt, "--work", str(tmp_path), "--sentences", "30", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "aggressive decoding (feature-ar): 300 sentences" in out
    for mode in ("feature-ar@4", "feature-ar@8", "feature-ar@8-dint8", "gad@8"):
        assert f"{mode}: output identical to greedy on 30/30 sentences" in out, out[-3000:]
    tpp = float(re.search(r"feature-ar@8: .*?, ([\d.]+) tokens per pass", out).group(1))
    assert tpp > 3.0, out[-3000:]  # 4.75 on all 300 sentences
