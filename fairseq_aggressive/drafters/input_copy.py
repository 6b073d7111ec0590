"""Input-guided drafter (IAD / Shallow Aggressive Decoding, Sun et al. 2021).

The draft is a copy of the source.  After a draft is rejected the generator
decodes one token per pass (empty drafts) until the suffix of the output
matches a unique place in the source; copying then resumes right after it.
"""
from typing import Dict, List, Optional, Tuple

import torch

from .base import Drafter


class InputCopyDrafter(Drafter):
    open_ended = True

    def __init__(self, src_dict, tgt_dict, ngram_min: int = 1, ngram_max: int = 4):
        if ngram_min < 1 or ngram_max < ngram_min:
            raise ValueError(
                f"--iad-ngram-min/--iad-ngram-max must satisfy 1 <= min <= max, "
                f"got {ngram_min}..{ngram_max}"
            )
        self.pad = src_dict.pad()
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # map source ids to target ids (identity for a joined dictionary)
        self.src_to_tgt: Optional[torch.Tensor] = None
        if src_dict.symbols != tgt_dict.symbols:
            self.src_to_tgt = torch.tensor(
                [tgt_dict.index(sym) for sym in src_dict.symbols], dtype=torch.long
            )
            self.src_to_tgt[src_dict.eos()] = tgt_dict.eos()
        self.src: List[List[int]] = []
        self.ptr: List[Optional[int]] = []
        self._index: Dict[int, Dict[Tuple[int, ...], int]] = {}

    def begin(self, sample, encoder_out=None) -> None:
        src_tokens = sample["net_input"]["src_tokens"].cpu()
        if self.src_to_tgt is not None:
            src_tokens = self.src_to_tgt[src_tokens]
        keep = sample["net_input"]["src_tokens"].cpu().ne(self.pad)
        self.src = [row[m].tolist() for row, m in zip(src_tokens, keep)]
        self.ptr = [0] * len(self.src)
        self._index = {}

    def propose(self, sent: int, output: List[int], cap: int) -> List[int]:
        p = self.ptr[sent]
        if p is None or cap <= 0:
            return []
        return self.src[sent][p : p + cap]

    def update(self, sent: int, output: List[int], n_draft: int, n_match: int) -> None:
        p, src = self.ptr[sent], self.src[sent]
        if p is not None and n_match == n_draft:
            nxt = p + n_draft
            # the verifier's own next token continues the copy: keep copying
            if nxt < len(src) and output[-1] == src[nxt]:
                self.ptr[sent] = nxt + 1 if nxt + 1 < len(src) else None
                return
        self.ptr[sent] = self._resync(sent, output)

    def _resync(self, sent: int, output: List[int]) -> Optional[int]:
        """Source position right after the unique occurrence of the output's
        suffix (shortest n-gram in the range that is unique), or None."""
        index = self._index.get(sent)
        if index is None:
            index = self._index[sent] = self._build_index(self.src[sent])
        src_len = len(self.src[sent])
        for n in range(self.ngram_min, min(self.ngram_max, len(output)) + 1):
            end = index.get(tuple(output[-n:]))
            if end is None:  # no occurrence: longer suffixes cannot occur either
                return None
            if end >= 0:  # unique occurrence
                return end if end < src_len else None
        return None

    def _build_index(self, src: List[int]) -> Dict[Tuple[int, ...], int]:
        """n-gram -> end position if it occurs once in ``src``, -1 if more often."""
        index: Dict[Tuple[int, ...], int] = {}
        for n in range(self.ngram_min, self.ngram_max + 1):
            for end in range(n, len(src) + 1):
                key = tuple(src[end - n : end])
                index[key] = -1 if key in index else end
        return index
