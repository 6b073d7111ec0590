"""tests/tiny_model.py: the tiny model the slow tests decode is kept with its
recipe; a session copies it while recipe and dictionary match, trains the
recipe again otherwise, and the kept one is what the recipe trains."""
import json

import pytest

import tiny_model


@pytest.mark.slow
def test_the_sessions_model_is_the_kept_one(trained):
    """The session's ``trained`` model came from tests/data/tiny-deep-shallow/:
    a recipe or data preparation changed without keeping the model again fails
    here (the session then trained it, a minute and a half)."""
    import torch

    data, ckpt = trained
    assert (ckpt.parent / "KEPT").is_file(), "the recipe or the dictionary changed: run python tests/tiny_model.py"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["cfg"]["task"]["data"] == str(data) and state["cfg"]["checkpoint"]["save_dir"] == str(ckpt.parent)
    assert state["optimizer_history"][-1]["num_updates"] == 600


def test_a_kept_model_of_another_recipe_or_dictionary_is_not_used(tmp_path, monkeypatch):
    """from_kept writes nothing for a dictionary other than the kept one's or
    a recipe other than the one it was kept with."""
    data_bin = tmp_path / "bin"
    data_bin.mkdir()
    (data_bin / "dict.src.txt").write_text("w 1\n")
    save = tmp_path / "ckpt"
    assert not tiny_model.from_kept(data_bin, save)
    stamp = json.loads((tiny_model.KEPT / "RECIPE.json").read_text())
    monkeypatch.setattr(tiny_model, "_sha256", lambda path: stamp["dict_sha256"])
    monkeypatch.setattr(tiny_model, "TRAIN", tiny_model.TRAIN[:-1] + ["601"])
    assert not tiny_model.from_kept(data_bin, save)
    assert not save.exists()
    monkeypatch.setattr(tiny_model, "TRAIN", stamp["recipe"]["train"])
    assert tiny_model.from_kept(data_bin, save)  # (the stand-in dictionary now passes for the kept one's)
    assert sorted(p.name for p in save.iterdir()) == ["KEPT", "checkpoint_last.pt"]


@pytest.mark.e2e
def test_the_recipe_trains_the_kept_model(tmp_path):
    """Training the recipe again ends at the kept model's training loss (within
    5%: other CPUs round otherwise) with the same parameters' shapes."""
    import torch

    stamp = json.loads((tiny_model.KEPT / "RECIPE.json").read_text())
    assert stamp["recipe"] == tiny_model.recipe()
    data_bin = tiny_model.prepare(tmp_path / "data")
    assert tiny_model.from_kept(data_bin, tmp_path / "kept")
    loss = tiny_model.train(data_bin, tmp_path / "ckpt")
    assert abs(loss - stamp["train_loss"]) <= 0.05 * stamp["train_loss"], (loss, stamp["train_loss"])
    kept = torch.load(tmp_path / "kept" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    new = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert {k: v.shape for k, v in kept.items()} == {k: v.shape for k, v in new.items()}
