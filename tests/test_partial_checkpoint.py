"""One loader initialises part of a model from an AR checkpoint: the block
drafter's encoder (--init-encoder-from) and the blockwise base (--init-from-ar)."""
import argparse

import pytest
import torch
from omegaconf import OmegaConf

from helpers import make_model, make_task
from fairseq_aggressive.models.partial_checkpoint import load_partial


def save_checkpoint(model, path):
    torch.save({
        "args": argparse.Namespace(arch="transformer"),
        "cfg": OmegaConf.create({"model": {"_name": "transformer"}}),
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": {},
    }, path)


def test_encoder_and_base_loaded_heads_kept(tmp_path):
    task = make_task()
    ar = make_model(task, seed=1)
    path = tmp_path / "ar.pt"
    save_checkpoint(ar, path)
    drafter = make_model(task, arch="block_nat", seed=2)
    load_partial(drafter.encoder, str(path), "--init-encoder-from", "the encoder", prefix="encoder.")
    for k, v in drafter.encoder.state_dict().items():
        assert torch.equal(v, ar.encoder.state_dict()[k]), k
    bw = make_model(task, arch="transformer_blockwise", seed=3, blockwise_k=3)
    heads = {k: v.clone() for k, v in bw.state_dict().items() if k.startswith("blockwise_heads.")}
    load_partial(bw, str(path), "--init-from-ar", "the base", skip=lambda k: k.startswith("blockwise_heads."))
    own = bw.state_dict()
    assert all(torch.equal(own[k], v) for k, v in heads.items()) and heads
    for k, v in ar.state_dict().items():
        assert torch.equal(own[k], v), k


def test_mismatches_are_clear_errors(tmp_path):
    task = make_task()
    path = tmp_path / "wide.pt"
    save_checkpoint(make_model(task, encoder_embed_dim=48, decoder_embed_dim=48), path)
    drafter = make_model(task, arch="block_nat")
    with pytest.raises(ValueError, match="--init-encoder-from: .* does not fit this model .*shape mismatch"):
        load_partial(drafter.encoder, str(path), "--init-encoder-from", "the encoder", prefix="encoder.")
    with pytest.raises(ValueError, match="no weights under 'nothing.'"):
        load_partial(drafter.encoder, str(path), "--init-encoder-from", "the encoder", prefix="nothing.")
    with pytest.raises(FileNotFoundError, match="--init-from-ar: no checkpoint"):
        load_partial(drafter, str(tmp_path / "missing.pt"), "--init-from-ar", "the base")


def test_init_from_a_blockwise_checkpoint_takes_its_heads(tmp_path):
    """--init-from-ar of a transformer_blockwise checkpoint loads its heads as well (the second
    stage of training heads and base together); an AR checkpoint leaves the new heads as built."""
    task = make_task()
    ar, trained = tmp_path / "ar.pt", tmp_path / "bw.pt"
    save_checkpoint(make_model(task, seed=1), ar)
    first = make_model(task, arch="transformer_blockwise", seed=2, blockwise_k=3, init_from_ar=str(ar))
    fresh = make_model(task, arch="transformer_blockwise", seed=2, blockwise_k=3)
    with torch.no_grad():
        for p in first.blockwise_heads.parameters():
            p.add_(0.5)
    save_checkpoint(first, trained)
    second = make_model(task, arch="transformer_blockwise", seed=7, blockwise_k=3, init_from_ar=str(trained))
    own = second.state_dict()
    # make_model scales the output projection after building: compare everything else
    for k, v in first.state_dict().items():
        if "output_projection" not in k:
            assert torch.equal(own[k], v), k
    for k, v in fresh.blockwise_heads.state_dict().items():
        assert not torch.equal(second.blockwise_heads.state_dict()[k], v), k
    with pytest.raises(ValueError, match="--init-from-ar: .* does not fit this model .*shape mismatch"):
        make_model(task, arch="transformer_blockwise", blockwise_k=4, init_from_ar=str(trained))
