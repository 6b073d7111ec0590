"""scripts/experiments/widen_model.py: a trained model widened to larger layer
shapes keeps its function (the benchmark's d=512 and d=1024 models are made
this way), and the native engine decodes the wide model exactly as fairseq's
greedy does."""
import os
import sys

import pytest

from fairseq_aggressive.native import build
from helpers import ROOT, generate, run

pytestmark = pytest.mark.slow

WIDEN = os.path.join(ROOT, "scripts", "experiments", "widen_model.py")


def test_widened_model_decodes_as_the_narrow_one(trained, trained_greedy, tmp_path):
    data, ckpt = trained  # d=64, 2 heads of 32, ffn 128, pre-norm, shared embeddings
    wide = tmp_path / "models" / "wide.pt"  # a folder not there yet: made by the script
    proc = run([sys.executable, WIDEN, str(ckpt), str(wide), "--dim", "256", "--ffn", "512", "--heads", "4",
                "--check-data", str(data)])
    assert "same argmax everywhere: True" in proc.stdout, proc.stdout
    worst = float(proc.stdout.split("narrow model: ")[1].split(";")[0])
    assert worst < 1e-4
    assert sorted(p.name for p in wide.parent.iterdir()) == ["wide.pt"]  # no temporary file left
    narrow_out = trained_greedy  # (fairseq-generate --beam 1, as below)
    wide_greedy, _ = generate(data, wide, "--decoding", "beam")
    wide_iad, gen = generate(data, wide, "--decoding", "iad")
    assert wide_greedy == narrow_out
    assert wide_iad == wide_greedy
    if build.available() is None:  # decoded on the engine, not on the torch fallback
        assert "verifier: the native engine" in gen.stderr


def test_widening_refuses_what_it_cannot_keep(trained, tmp_path):
    _, ckpt = trained
    with pytest.raises(AssertionError, match="cannot widen 2 heads of 32 to 3 heads"):
        run([sys.executable, WIDEN, str(ckpt), str(tmp_path / "w.pt"), "--dim", "192", "--ffn", "384",
             "--heads", "3"])
    with pytest.raises(AssertionError, match="--dim must be a multiple of 64"):
        run([sys.executable, WIDEN, str(ckpt), str(tmp_path / "w.pt"), "--dim", "100", "--heads", "2"])
    assert not (tmp_path / "w.pt").exists()
