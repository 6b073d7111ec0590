"""The native engine's stage times (csrc/model/stages.h), read from its test library.

Only the test library (:func:`fairseq_aggressive.native.build.test_library`)
counts them; :func:`use_test_library` makes the engines built afterwards in
this process load it.
"""
import ctypes
from typing import Dict

# csrc/model/stages.h's Stage, in order
STAGES = ("encoder", "pass", "embed", "self q/k/v", "self attention", "self out", "cross q", "cross attention",
          "cross out", "ffn", "projection", "choose", "emit")


def use_test_library() -> None:
    """Native engines made from now on in this process load the test library."""
    from fairseq_aggressive.native import build
    from fairseq_aggressive.native import engine

    engine.library = lambda isa=None: build.test_library(isa)


def read(reset: bool = True) -> Dict[str, float]:
    """Seconds per stage since the last reset (and reset them)."""
    from fairseq_aggressive.native import build

    lib = build.test_library()
    ns = (ctypes.c_int64 * (2 * len(STAGES)))()
    count = lib.fa_stage_times(ns, len(STAGES), int(reset))
    if count != len(STAGES):
        raise RuntimeError(f"the engine counts {count} stages, this module names {len(STAGES)}")
    return {name: ns[2 * i] * 1e-9 for i, name in enumerate(STAGES)}
