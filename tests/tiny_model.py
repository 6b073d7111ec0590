"""The tiny deep/shallow model the slow tests decode (the ``trained`` fixture):
2+1 layers of 64, trained 600 updates on the bundled UA-GEC sample.  Its
weights are kept in tests/data/tiny-deep-shallow/ with the recipe that made
them, so a test session prepares the data (seconds) and copies them instead of
training for a minute and a half; when the recipe or the prepared data's
dictionary no longer match what was kept, the session trains it again.

    python tests/tiny_model.py     # trains the recipe and keeps the result
"""
import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEPT = HERE / "data" / "tiny-deep-shallow"

TINY = ["--encoder-layers", "2", "--decoder-layers", "1",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings", "--encoder-normalize-before", "--decoder-normalize-before"]
COMMON = ["--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt",
          "--warmup-updates", "50", "--max-tokens", "3000", "--dropout", "0",
          "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "simple",
          "--seed", "1"]
PREPARE = ["scripts/data/prepare_uagec.py", "--from-text", "data/uagec-sample", "--bpe-ops", "1000"]
TRAIN = ["--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
         "--arch", "transformer_deep_shallow", *TINY, *COMMON,
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-update", "600"]


def recipe():
    return {"prepare": PREPARE, "train": TRAIN}


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def prepare(data):
    from helpers import run

    run([sys.executable, PREPARE[0], *PREPARE[1:3], "--out", str(data), *PREPARE[3:]])
    return data / "bin"


def train(data_bin, save):
    """The recipe's training run; its final training loss."""
    from helpers import USER_DIR, run, tool

    proc = run([tool("fairseq-train"), str(data_bin), "--user-dir", USER_DIR, *TRAIN, "--save-dir", str(save)])
    losses = re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+) ", proc.stdout + proc.stderr)
    assert losses, (proc.stdout + proc.stderr)[-3000:]
    return float(losses[-1])


def from_kept(data_bin, save):
    """Writes the kept model into ``save`` as the recipe's checkpoint_last.pt
    would be (its paths those of this data and directory); False, nothing
    written, if the kept one was made by another recipe or dictionary."""
    import torch

    try:
        stamp = json.loads((KEPT / "RECIPE.json").read_text())
    except OSError:
        return False
    if not (KEPT / "checkpoint.pt").is_file():
        return False
    if stamp["recipe"] != recipe() or stamp["dict_sha256"] != _sha256(data_bin / "dict.src.txt"):
        return False
    state = torch.load(KEPT / "checkpoint.pt", map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = str(data_bin)
    state["cfg"]["checkpoint"]["save_dir"] = str(save)
    save.mkdir(parents=True, exist_ok=True)
    torch.save(state, save / "checkpoint_last.pt")
    (save / "KEPT").write_text(str(KEPT) + "\n")  # this model is the kept one (tests/test_tiny_model.py)
    return True


def keep(work):
    """Trains the recipe in ``work`` and keeps its model (weights, without
    the optimizer's state) and the recipe in tests/data/tiny-deep-shallow/."""
    import torch

    data_bin = prepare(Path(work) / "data")
    loss = train(data_bin, Path(work) / "ckpt")
    state = torch.load(Path(work) / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    state.pop("last_optimizer_state", None)
    state["cfg"]["task"]["data"] = state["cfg"]["checkpoint"]["save_dir"] = ""
    KEPT.mkdir(parents=True, exist_ok=True)
    torch.save(state, KEPT / "checkpoint.pt")
    stamp = {"recipe": recipe(), "dict_sha256": _sha256(data_bin / "dict.src.txt"), "train_loss": loss}
    (KEPT / "RECIPE.json").write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        print(keep(work))
