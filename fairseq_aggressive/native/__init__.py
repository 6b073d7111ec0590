"""The compiled CPU engine (C++ in csrc/): compiled into the package per
instruction-set target (targets.py), the best one for this CPU loaded with
ctypes (build.py), used by the verifiers for exact greedy verification."""
from .build import NativeUnavailable, available, library

__all__ = ["NativeUnavailable", "available", "library", "NativeEngine", "NativeBatch", "check_native"]


def __getattr__(name):
    if name in ("NativeBatch", "NativeEngine", "check_native"):  # (the engine's module loads torch)
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
