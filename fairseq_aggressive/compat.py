"""Compatibility shims applied when the plugin is imported.

torch >= 2.6 defaults ``torch.load(weights_only=True)``; fairseq 0.12 checkpoints
pickle argparse/omegaconf objects, so stock ``fairseq-generate`` fails to load
them.  Checkpoints are files the user names explicitly (``--path``), exactly as
before torch 2.6, so inside ``fairseq.checkpoint_utils`` only we restore the old
default (``weights_only=False``) unless a caller asks otherwise.  Nothing else in
the process is affected and no environment variable is touched.
"""
import types

import torch


class _TorchWithTrustedLoad(types.ModuleType):
    """Stand-in for the ``torch`` module seen by fairseq.checkpoint_utils."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(*args, **kwargs):
        kwargs.setdefault("weights_only", False)
        return torch.load(*args, **kwargs)


def patch_checkpoint_loading():
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.torch, _TorchWithTrustedLoad):
        checkpoint_utils.torch = _TorchWithTrustedLoad()
