"""The compiled CPU engine (C++ in csrc/): built at first use, loaded
with ctypes, used by the generator for exact greedy verification."""
from .build import NativeUnavailable, available, library
from .engine import NativeBatch, NativeEngine, check_native

__all__ = ["NativeUnavailable", "available", "library", "NativeEngine", "NativeBatch", "check_native"]
