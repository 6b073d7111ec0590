from .base import Drafter
from .blockwise_heads import BlockwiseHeadsDrafter
from .input_copy import InputCopyDrafter
from .nar_block import DrafterMismatchError, NARBlockDrafter, check_drafter

__all__ = ["Drafter", "InputCopyDrafter", "NARBlockDrafter", "BlockwiseHeadsDrafter",
           "DrafterMismatchError", "check_drafter"]
