"""The storage the engine's kernels read starts on a cache line: packed
weights (float32, float16, int8; large and small layers) and a model's row,
cache and logit buffers, on this machine's target and the portable one."""
import ctypes

import numpy as np
import pytest

from fairseq_aggressive.native import build
from helpers import fast_first, needs_native


@needs_native
@pytest.mark.parametrize("isa", fast_first(["default", "generic"]))
def test_weights_and_buffers_start_on_a_cache_line(isa):
    lib = build.test_library(None if isa == "default" else isa)
    offsets = np.full(64, -1, dtype=np.int64)
    n = lib.fa_test_storage_offsets(offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(offsets))
    assert n == 4 * 3 + 3, n  # 4 layer shapes x 3 storages, 3 buffer sizes
    assert offsets[:n].tolist() == [0] * n
