"""A batch's token rows as the engine's loops take them: padding removed,
concatenated, with each row's length."""
from typing import Optional, Tuple

import numpy as np
import torch


def unpadded(tokens: torch.Tensor, pad: int, id_map: Optional[torch.Tensor] = None
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(flat, lengths, keep)`` of a B x S batch of token ids: its non-pad ids
    row after row (int32; through ``id_map`` when given), each row's count of
    them (int32) and the non-pad mask.  numpy on a batch's few ids: after the
    engine's calls have pushed Python's code out of the caches, each small torch
    operation costs 10-15 us."""
    ids = tokens.cpu().numpy()
    keep = ids != pad
    if id_map is not None:
        ids = id_map.numpy()[ids]
    return ids[keep].astype(np.int32), keep.sum(1, dtype=np.int32), keep
