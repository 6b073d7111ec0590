from .base import Drafter
from .blockwise_heads import BlockwiseHeadsDrafter
from .input_copy import InputCopyDrafter
from .nar_block import NARBlockDrafter
from .nar_block_checkpoint import DrafterMismatchError, check_drafter, load_block_drafter

__all__ = ["Drafter", "InputCopyDrafter", "NARBlockDrafter", "BlockwiseHeadsDrafter",
           "DrafterMismatchError", "check_drafter", "load_block_drafter"]
