"""Initialising part of a model from another model's checkpoint: the block
drafter's encoder from the AR model (``--init-encoder-from``), the blockwise
model's base Transformer from the AR model (``--init-from-ar``)."""
import logging
import os
from typing import Callable

from fairseq import checkpoint_utils
from torch import nn

logger = logging.getLogger(__name__)


def _buffer_only(name: str) -> bool:
    # fairseq's per-module buffers that checkpoints need not hold
    return name.endswith("_float_tensor") or name.endswith(".version")


def load_partial(module: nn.Module, path: str, flag: str, what: str, prefix: str = "",
                 skip: Callable[[str], bool] = lambda name: False) -> None:
    """Load into ``module`` the weights of the checkpoint at ``path`` whose names
    start with ``prefix`` (``prefix`` removed).  Every weight of ``module`` except
    those ``skip`` names must be there with the same shape; weights of the
    checkpoint that ``module`` lacks are ignored.  Errors name ``flag``; the
    log line says ``what`` was initialised."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{flag}: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    theirs = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not theirs:
        raise ValueError(f"{flag}: {path} has no weights under {prefix!r}")
    own = {k: v for k, v in module.state_dict().items() if not skip(k)}
    missing = [k for k in own if k not in theirs and not _buffer_only(k)]
    bad = [k for k in own if k in theirs and theirs[k].shape != own[k].shape]
    if missing or bad:
        raise ValueError(
            f"{flag}: {path} does not fit this model (missing: {missing[:3]}, shape mismatch: {bad[:3]}); "
            "use the same architecture and dictionaries as the model it was trained as"
        )
    module.load_state_dict({k: v for k, v in theirs.items() if k in own}, strict=False)
    logger.info(f"initialised {what} from {path}")


def checkpoint_has_heads(path: str) -> bool:
    """Whether the checkpoint at ``path`` holds blockwise proposal heads."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--init-from-ar: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    return any(name.startswith("blockwise_heads.") for name in state)
