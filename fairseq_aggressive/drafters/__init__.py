"""Drafters: what proposes tokens for the verifier (:class:`Drafter`), and
:data:`DECODINGS`, each aggressive ``--decoding`` with the function that builds
its drafter and acceptance rule from the decoding options.  A new decoding is
a drafter module with such a builder and its line here."""
from .base import Branch, Drafter, DrafterCaps, DraftOutcome, single_drafts
from .blockwise_heads import BlockwiseHeadsDrafter, build_blockwise
from .feature_ar import FeatureARDrafter, build_feature_ar
from .input_copy import InputCopyDrafter, build_iad
from .nar_block import NARBlockDrafter
from .nar_block_checkpoint import DrafterMismatchError, build_gad, check_drafter, load_block_drafter

# --decoding NAME -> builder(DecodingOptions, task, models) -> (drafter, acceptance rule)
DECODINGS = {"iad": build_iad, "gad": build_gad, "blockwise": build_blockwise, "feature-ar": build_feature_ar}

__all__ = ["Drafter", "DrafterCaps", "DraftOutcome", "Branch", "single_drafts", "InputCopyDrafter", "NARBlockDrafter",
           "BlockwiseHeadsDrafter", "FeatureARDrafter", "DrafterMismatchError", "check_drafter", "load_block_drafter", "DECODINGS"]
