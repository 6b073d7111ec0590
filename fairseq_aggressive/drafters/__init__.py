from .base import Drafter
from .input_copy import InputCopyDrafter

__all__ = ["Drafter", "InputCopyDrafter"]
