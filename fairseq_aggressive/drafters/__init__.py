"""Drafters: what proposes tokens for the verifier (:class:`Drafter`), and
:data:`DECODINGS`, each aggressive ``--decoding`` with the function that builds
its drafter and acceptance rule from the decoding options.  A new decoding is
a drafter module with such a builder and its line here.

Nothing heavy is imported until used: the command lines read the table's names
to build their parsers (``--help`` answers without loading torch); a builder's
module and this package's classes load on first use."""
import importlib


class _Builder:
    """``module.function``, imported when first called."""

    def __init__(self, module: str, function: str):
        self.module, self.function = module, function

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.function)(*args, **kwargs)

    def __repr__(self):
        return f"<builder {__name__}.{self.module}.{self.function}>"


# --decoding NAME -> builder(DecodingOptions, task, models) -> (drafter, acceptance rule)
DECODINGS = {"iad": _Builder("input_copy", "build_iad"), "gad": _Builder("nar_block_checkpoint", "build_gad"),
             "blockwise": _Builder("blockwise_heads", "build_blockwise"),
             "feature-ar": _Builder("feature_ar", "build_feature_ar")}

_EXPORTS = {"Drafter": "base", "DrafterCaps": "base", "DraftOutcome": "base", "Branch": "base",
            "single_drafts": "base", "InputCopyDrafter": "input_copy", "NARBlockDrafter": "nar_block",
            "BlockwiseHeadsDrafter": "blockwise_heads", "FeatureARDrafter": "feature_ar",
            "DrafterMismatchError": "nar_block_checkpoint", "check_drafter": "nar_block_checkpoint",
            "load_block_drafter": "nar_block_checkpoint"}

__all__ = [*_EXPORTS, "DECODINGS"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
