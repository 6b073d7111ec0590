"""The tiny models the slow tests decode, each kept with the recipe that made it:
``ar``, the deep/shallow model (the ``trained`` fixture: 2+1 layers of 64,
trained 600 updates on the bundled UA-GEC sample); ``drafter``, a block_nat
drafter (k=4, glancing training, its encoder initialised from ``ar``: the
``trained_drafter`` fixture); ``blockwise``, proposal heads (k=4) trained on
``ar`` frozen (``trained_blockwise``).  Their weights are kept in
tests/data/tiny-*/, so a test session prepares the data (seconds) and copies
them instead of training for two and a half minutes; when a recipe, the
prepared data's dictionary or (for the two built on it) the kept ``ar`` no
longer match what was kept, the session trains that model again.
tests/test_tiny_model.py (e2e) trains each recipe and compares.

    python tests/tiny_model.py [NAME ...]     # trains the recipes (all three) and keeps the results
"""
import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

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
_TASK = ["--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt"]
# name -> (kept directory, fairseq-train arguments, the flag that initialises it from ``ar`` or None)
RECIPES = {
    "ar": ("tiny-deep-shallow",
           [*_TASK, "--arch", "transformer_deep_shallow", *TINY, *COMMON,
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-update", "600"],
           None),
    "drafter": ("tiny-block-nat-drafter",
                [*_TASK, "--arch", "block_nat", *TINY, *COMMON, "--criterion", "glat_block_loss",
                 "--block-size", "4", "--glat-anneal-updates", "200", "--max-update", "200", "--log-interval", "20"],
                "--init-encoder-from"),
    "blockwise": ("tiny-blockwise-heads",
                  [*_TASK, "--arch", "transformer_blockwise", "--blockwise-k", "4", *TINY, *COMMON,
                   "--criterion", "blockwise_cross_entropy", "--max-update", "150", "--log-interval", "10"],
                  "--init-from-ar --freeze-base"),
}


def kept_dir(name):
    return HERE / "data" / RECIPES[name][0]


def recipe(name="ar"):
    _, train_args, init = RECIPES[name]
    return {"prepare": PREPARE, "train": train_args, **({"init_from_ar": init} if init else {})}


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def prepare(data):
    from helpers import run

    run([sys.executable, PREPARE[0], *PREPARE[1:3], "--out", str(data), *PREPARE[3:]])
    return data / "bin"


def train(name, data_bin, save, ar=None):
    """The recipe's training run (``ar``: the checkpoint it starts from, for the
    models built on ``ar``): (its final training loss, its log)."""
    from helpers import USER_DIR, run, tool

    _, train_args, init = RECIPES[name]
    extra = [init.split()[0], str(ar), *init.split()[1:]] if init else []
    proc = run([tool("fairseq-train"), str(data_bin), "--user-dir", USER_DIR, *train_args, *extra,
                "--save-dir", str(save)])
    log = proc.stdout + proc.stderr
    losses = re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+) ", log)
    assert losses, log[-3000:]
    return float(losses[-1]), log


def _stamp_matches(name, data_bin, ar):
    try:
        stamp = json.loads((kept_dir(name) / "RECIPE.json").read_text())
    except OSError:
        return False
    if not (kept_dir(name) / "checkpoint.pt").is_file():
        return False
    if stamp["recipe"] != recipe(name) or stamp["dict_sha256"] != _sha256(data_bin / "dict.src.txt"):
        return False
    if RECIPES[name][2]:  # built on ar: on the kept one, the session's
        if ar is None or not (Path(ar).parent / "KEPT").is_file():
            return False
        if stamp.get("ar_sha256") != _sha256(kept_dir("ar") / "checkpoint.pt"):
            return False
    return True


def from_kept(name, data_bin, save, ar=None):
    """Writes the kept model into ``save`` as the recipe's checkpoint_last.pt
    would be (its paths those of this data and directory); False, nothing
    written, if the kept one was made by another recipe, dictionary or ``ar``."""
    import torch

    if not _stamp_matches(name, data_bin, ar):
        return False
    state = torch.load(kept_dir(name) / "checkpoint.pt", map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = str(data_bin)
    state["cfg"]["checkpoint"]["save_dir"] = str(save)
    save.mkdir(parents=True, exist_ok=True)
    torch.save(state, save / "checkpoint_last.pt")
    (save / "KEPT").write_text(str(kept_dir(name)) + "\n")  # this model is the kept one (tests/test_tiny_model.py)
    return True


def keep(work, names=tuple(RECIPES)):
    """Trains the recipes in ``work`` (``ar`` first: the others start from it) and
    keeps each model (weights, without the optimizer's state) with its recipe in
    tests/data/tiny-*/."""
    import torch

    data_bin = prepare(Path(work) / "data")
    ar_save = Path(work) / "ar"
    if "ar" not in names and not from_kept("ar", data_bin, ar_save):
        names = ("ar", *names)  # (the kept ar is another recipe's: kept again first)
    stamps = {}
    for name in sorted(names, key=lambda n: n != "ar"):
        save = Path(work) / name
        loss, _ = train(name, data_bin, save, ar=ar_save / "checkpoint_last.pt")
        state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        state.pop("last_optimizer_state", None)
        state["cfg"]["task"]["data"] = state["cfg"]["checkpoint"]["save_dir"] = ""
        kept_dir(name).mkdir(parents=True, exist_ok=True)
        torch.save(state, kept_dir(name) / "checkpoint.pt")
        stamp = {"recipe": recipe(name), "dict_sha256": _sha256(data_bin / "dict.src.txt"), "train_loss": loss}
        if RECIPES[name][2]:
            stamp["ar_sha256"] = _sha256(kept_dir("ar") / "checkpoint.pt")
        (kept_dir(name) / "RECIPE.json").write_text(json.dumps(stamp, indent=1) + "\n")
        if name == "ar":
            (save / "KEPT").write_text(str(kept_dir(name)) + "\n")
        stamps[name] = stamp
    return stamps


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        print(json.dumps(keep(work, tuple(sys.argv[1:]) or tuple(RECIPES)), indent=1))
