"""tests/tiny_model.py: the tiny models the slow tests decode are kept with their
recipes; a session copies them while recipe, dictionary (and the AR model the
others are built on) match, trains the recipe again otherwise, and each kept
model is what its recipe trains: the training runs themselves are tested here
(e2e), the drafter's glancing loss and the proposal heads' loss going down."""
import json
import re
from pathlib import Path

import pytest

import tiny_model


@pytest.mark.slow
def test_the_sessions_models_are_the_kept_ones(trained, trained_drafter, trained_blockwise):
    """The session's ``trained``, ``trained_drafter`` and ``trained_blockwise`` came
    from tests/data/tiny-*/: a recipe or data preparation changed without keeping
    the models again fails here (the session then trained them, minutes)."""
    import torch

    data, ckpt = trained
    for name, path, updates in (("ar", ckpt, 600), ("drafter", trained_drafter, 200),
                                ("blockwise", trained_blockwise, 150)):
        assert (path.parent / "KEPT").is_file(), f"{name}'s recipe or the dictionary changed: run " \
                                                 f"python tests/tiny_model.py {name}"
        state = torch.load(path, map_location="cpu", weights_only=False)
        assert state["cfg"]["task"]["data"] == str(data) and state["cfg"]["checkpoint"]["save_dir"] == str(path.parent)
        assert state["optimizer_history"][-1]["num_updates"] == updates


def test_a_kept_model_of_another_recipe_or_dictionary_is_not_used(tmp_path, monkeypatch):
    """from_kept writes nothing for a dictionary other than the kept one's or
    a recipe other than the one it was kept with; a model built on the AR model
    is kept only on the kept AR model."""
    data_bin = tmp_path / "bin"
    data_bin.mkdir()
    (data_bin / "dict.src.txt").write_text("w 1\n")
    save = tmp_path / "ckpt"
    assert not tiny_model.from_kept("ar", data_bin, save)
    stamp = json.loads((tiny_model.kept_dir("ar") / "RECIPE.json").read_text())
    real_sha256 = tiny_model._sha256
    monkeypatch.setattr(tiny_model, "_sha256",
                        lambda path: stamp["dict_sha256"] if Path(path).name == "dict.src.txt" else real_sha256(path))
    kept_train = tiny_model.RECIPES["ar"]
    monkeypatch.setitem(tiny_model.RECIPES, "ar", (kept_train[0], kept_train[1][:-1] + ["601"], None))
    assert not tiny_model.from_kept("ar", data_bin, save)
    assert not save.exists()
    monkeypatch.setitem(tiny_model.RECIPES, "ar", kept_train)
    assert tiny_model.from_kept("ar", data_bin, save)  # (the stand-in dictionary now passes for the kept one's)
    assert sorted(p.name for p in save.iterdir()) == ["KEPT", "checkpoint_last.pt"]
    # the drafter: not on an AR model that is not the kept one, then on the kept one
    other_ar = tmp_path / "other" / "checkpoint_last.pt"
    assert not tiny_model.from_kept("drafter", data_bin, tmp_path / "drafter", other_ar)
    assert not (tmp_path / "drafter").exists()
    assert tiny_model.from_kept("drafter", data_bin, tmp_path / "drafter", save / "checkpoint_last.pt")


def _loss_goes_down(name, log):
    """What each recipe's log must show besides its final loss."""
    train = [float(x) for x in re.findall(r"train_inner \| .*?\bloss=([\d.]+)", log)] or \
        [float(x) for x in re.findall(r"\| loss ([\d.]+) \| nll_loss [\d.]+ \| (?:block_acc|acc_h1)", log)]
    if name == "drafter":
        assert len(train) >= 3 and train[-1] < train[0] - 1.0, train
        valid = [float(x) for x in re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", log)]
        assert len(valid) >= 2 and valid[-1] < valid[0], valid
        assert "initialised the drafter's encoder from" in log
    elif name == "blockwise":
        assert len(train) >= 3 and train[-1] < train[0] - 0.5, train
        heads = [float(x) for x in re.findall(r"valid on 'valid' subset .*?acc_h2 ([\d.]+)", log)]
        assert heads and heads[-1] > 0.05, heads
        assert "initialised the base Transformer from" in log


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(tiny_model.RECIPES))
def test_the_recipe_trains_the_kept_model(name, tmp_path):
    """Training the recipe again (on the kept AR model where it is built on it)
    ends at the kept model's training loss (within 5%: other CPUs round
    otherwise) with the same parameters' shapes, its loss going down as it trains."""
    import torch

    stamp = json.loads((tiny_model.kept_dir(name) / "RECIPE.json").read_text())
    assert stamp["recipe"] == tiny_model.recipe(name)
    data_bin = tiny_model.prepare(tmp_path / "data")
    ar = None
    if name != "ar":
        assert tiny_model.from_kept("ar", data_bin, tmp_path / "ar")
        ar = tmp_path / "ar" / "checkpoint_last.pt"
    assert tiny_model.from_kept(name, data_bin, tmp_path / "kept", ar)
    loss, log = tiny_model.train(name, data_bin, tmp_path / "ckpt", ar)
    assert abs(loss - stamp["train_loss"]) <= 0.05 * stamp["train_loss"], (loss, stamp["train_loss"])
    _loss_goes_down(name, log)
    kept = torch.load(tmp_path / "kept" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    new = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert {k: v.shape for k, v in kept.items()} == {k: v.shape for k, v in new.items()}
