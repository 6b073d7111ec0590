"""The compiled CPU engine (C++ in csrc/): compiled into the package per
instruction-set target (targets.py), the best one for this CPU loaded with
ctypes (build.py), used by the verifiers for exact greedy verification."""
from .build import NativeUnavailable, available, library
from .engine import NativeBatch, NativeEngine, check_native

__all__ = ["NativeUnavailable", "available", "library", "NativeEngine", "NativeBatch", "check_native"]
