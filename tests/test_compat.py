"""Stock fairseq checkpoint loading works under torch >= 2.6 once the plugin is imported."""
import argparse
import pickle

import pytest
import torch
from omegaconf import OmegaConf


def test_fairseq_checkpoint_loads_without_env(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    path = tmp_path / "ckpt.pt"
    state = {
        "args": argparse.Namespace(arch="transformer"),
        "cfg": OmegaConf.create({"model": {"_name": "transformer"}}),
        "model": {"w": torch.ones(2)},
        "optimizer_history": [
            {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
             "lr_scheduler_state": {"best": None}, "num_updates": 0}
        ],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": {},
    }
    torch.save(state, path)
    # the failure we fix: torch's default weights_only loading refuses these objects
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path)

    import fairseq_aggressive  # noqa: F401
    from fairseq import checkpoint_utils

    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(loaded["model"]["w"], torch.ones(2))
    # plain torch.load elsewhere keeps torch's safe default
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path)
