from .base import Drafter
from .input_copy import InputCopyDrafter
from .nar_block import DrafterMismatchError, NARBlockDrafter, check_drafter

__all__ = ["Drafter", "InputCopyDrafter", "NARBlockDrafter", "DrafterMismatchError", "check_drafter"]
