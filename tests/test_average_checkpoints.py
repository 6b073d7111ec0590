"""scripts/experiments/average_checkpoints.py: the last N interval checkpoints of a
run averaged parameter by parameter into one checkpoint fairseq loads."""
import importlib.util
import os

import pytest
import torch

from helpers import ROOT

_spec = importlib.util.spec_from_file_location(
    "average_checkpoints", os.path.join(ROOT, "scripts", "experiments", "average_checkpoints.py"))
average_checkpoints = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(average_checkpoints)


def _save(path, updates, value):
    from fairseq import checkpoint_utils

    state = {"model": {"w": torch.full((2, 3), float(value)), "h": torch.full((2,), float(value)).half(),
                       "steps": torch.tensor([updates])},
             "cfg": None, "args": None, "extra_state": {"train_iterator": {"epoch": 1}},
             "optimizer_history": [{"criterion_name": "c", "optimizer_name": "o",
                                    "lr_scheduler_state": {"best": 0.0}, "num_updates": updates}],
             "last_optimizer_state": None}
    checkpoint_utils.torch_persistent_save(state, str(path))


def test_the_last_n_are_averaged(tmp_path):
    for i, updates in enumerate([100, 200, 300, 400, 1000]):  # file order is not update order
        _save(tmp_path / f"checkpoint_{1 + i // 2}_{updates}.pt", updates, value=updates)
    _save(tmp_path / "checkpoint_best.pt", 7, value=-1.0)  # not an interval checkpoint
    out = tmp_path / "avg" / "checkpoint_avg3.pt"
    assert average_checkpoints.main([str(tmp_path), "--last", "3", "--output", str(out)]) == 0
    state = torch.load(out, map_location="cpu", weights_only=False)
    assert torch.allclose(state["model"]["w"], torch.full((2, 3), (300 + 400 + 1000) / 3))
    assert state["model"]["h"].dtype == torch.float16
    assert state["model"]["steps"].tolist() == [1000]  # not a float: the newest checkpoint's
    assert state["optimizer_history"][-1]["num_updates"] == 1000


def test_too_few_checkpoints_are_refused(tmp_path):
    _save(tmp_path / "checkpoint_1_100.pt", 100, 1.0)
    with pytest.raises(SystemExit, match="holds 1 interval checkpoints .* 10 are needed"):
        average_checkpoints.main([str(tmp_path), "--last", "10", "--output", str(tmp_path / "a.pt")])
    assert not (tmp_path / "a.pt").exists()
