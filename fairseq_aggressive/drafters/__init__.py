from .base import Branch, Drafter, DrafterCaps, DraftOutcome, single_drafts
from .blockwise_heads import BlockwiseHeadsDrafter
from .input_copy import InputCopyDrafter
from .nar_block import NARBlockDrafter
from .nar_block_checkpoint import DrafterMismatchError, check_drafter, load_block_drafter

__all__ = ["Drafter", "DrafterCaps", "DraftOutcome", "Branch", "single_drafts", "InputCopyDrafter", "NARBlockDrafter", "BlockwiseHeadsDrafter",
           "DrafterMismatchError", "check_drafter", "load_block_drafter"]
