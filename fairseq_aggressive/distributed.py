"""fairseq's distributed training on CPU processes, and a parameter checksum
per rank.

fairseq 0.12 assumes one GPU per process when it trains with several: on a
machine without CUDA it cannot start ``torchrun`` ranks (``rank %
torch.cuda.device_count()``), spawns ``min(GPUs, world size)`` = 0 processes
for ``--distributed-world-size N``, hands CPU modules to DDP with
``device_ids`` (rejected by torch), and gathers logging outputs into CUDA
buffers.  Under ``torchrun`` it also leaves ``--distributed-world-size`` at its
CPU default of 1, so every rank trains alone on all the data.  When the plugin
is imported (``--user-dir fairseq_aggressive``) and CUDA is not available,
:func:`patch_cpu_distributed` makes those places take CPU processes: the world
size comes from ``torchrun`` (``WORLD_SIZE``) unless given, ``fairseq-train
--distributed-world-size N`` on one machine spawns N processes, DDP gets no
device ids, and logging outputs are gathered with ``all_gather_object``.  GPU
runs are untouched: every patched function calls fairseq's own where CUDA is
available.  docs/distributed.md has the commands.

``FAIRSEQ_AGGRESSIVE_RANK_CHECKSUMS=DIR`` makes every rank write, whenever
fairseq saves a checkpoint, ``DIR/rank{R}.json`` with its update count and a
SHA-256 of its model parameters: ranks that disagree show up there.
"""
import functools
import hashlib
import json
import logging
import os
import socket

import torch

logger = logging.getLogger("fairseq_aggressive")

CHECKSUM_ENV = "FAIRSEQ_AGGRESSIVE_RANK_CHECKSUMS"
_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def _cpu() -> bool:
    return not torch.cuda.is_available()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launched() -> bool:
    return all(k in os.environ for k in _LAUNCH_ENV)


def _infer_init_method(orig, cfg, force_distributed=False):
    if _cpu() and cfg.distributed_backend == "nccl":  # fairseq's default; NCCL needs GPUs
        cfg.distributed_backend = "gloo"
    if _cpu() and cfg.distributed_init_method is None and not cfg.tpu:
        if _launched():
            world = int(os.environ["WORLD_SIZE"])
            if cfg.distributed_world_size == 1 and world > 1:  # fairseq's CPU default, not the user's choice
                cfg.distributed_world_size = world
            if cfg.distributed_world_size != world:
                raise ValueError(f"--distributed-world-size {cfg.distributed_world_size} but the launcher "
                                 f"started WORLD_SIZE={world} processes")
            if world > 1:
                cfg.distributed_init_method = "env://"
                cfg.distributed_rank = int(os.environ["RANK"])
                cfg.device_id = int(os.environ.get("LOCAL_RANK", 0))
                cfg.distributed_no_spawn = True
            return
        if cfg.distributed_world_size > 1 and not any(
                os.environ.get(k) for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")):
            # one machine: fairseq spawns the processes (patched call_main below)
            cfg.distributed_init_method = f"tcp://localhost:{_free_port()}"
            cfg.distributed_rank = 0
            return
    return orig(cfg, force_distributed)


def _call_main(orig, cfg, main, **kwargs):
    from fairseq.distributed import utils as dist_utils

    dt = cfg.distributed_training
    if _cpu() and dt.distributed_init_method is None:
        dist_utils.infer_init_method(dt)
    if _cpu() and dt.distributed_init_method is not None and not dt.distributed_no_spawn:
        # fairseq spawns min(GPUs, world size) processes: on CPU, one per rank of this node
        n = dt.distributed_world_size
        start_rank = dt.distributed_rank or 0
        dt.distributed_rank = None
        kwargs["start_rank"] = start_rank
        torch.multiprocessing.spawn(fn=dist_utils.distributed_main, args=(main, cfg, kwargs), nprocs=n, join=True)
        return
    return orig(cfg, main, **kwargs)


def _all_gather_list(orig, data, group=None, max_size=16384):
    if not _cpu():
        return orig(data, group=group, max_size=max_size)
    from fairseq import utils
    from fairseq.distributed import utils as dist_utils

    group = dist_utils.get_global_group() if group is None else group
    out = [None] * dist_utils.get_world_size(group=group)
    torch.distributed.all_gather_object(out, utils.move_to_cpu(data), group=group)
    return out


class _CpuAwareDDP(torch.nn.parallel.DistributedDataParallel):
    """DistributedDataParallel that drops ``device_ids`` for a CPU module."""

    def __init__(self, module, *args, **kwargs):
        if next(module.parameters()).device.type == "cpu":
            kwargs["device_ids"] = None
            kwargs["output_device"] = None
        super().__init__(module, *args, **kwargs)


def _model_checksum(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _save_checkpoint(orig, cfg, trainer, epoch_itr, val_loss):
    out = orig(cfg, trainer, epoch_itr, val_loss)
    folder = os.environ.get(CHECKSUM_ENV)
    if folder:
        os.makedirs(folder, exist_ok=True)
        rank = trainer.data_parallel_rank
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": trainer.data_parallel_world_size,
                       "num_updates": trainer.get_num_updates(), "sha256": _model_checksum(trainer.model)}, f)
    return out


def _wrap(module, name, wrapper):
    orig = getattr(module, name)
    if getattr(orig, "_fairseq_aggressive", False):
        return
    fn = functools.wraps(orig)(functools.partial(wrapper, orig))
    fn._fairseq_aggressive = True
    setattr(module, name, fn)


def patch_cpu_distributed():
    """Apply the patches (idempotent); see the module docstring."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as dist_utils
    from fairseq.models import distributed_fairseq_model

    _wrap(dist_utils, "infer_init_method", _infer_init_method)
    _wrap(dist_utils, "call_main", _call_main)
    _wrap(dist_utils, "all_gather_list", _all_gather_list)
    _wrap(checkpoint_utils, "save_checkpoint", _save_checkpoint)
    distributed_fairseq_model.DistributedDataParallel = _CpuAwareDDP
