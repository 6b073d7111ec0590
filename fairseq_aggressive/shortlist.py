"""Output-vocabulary shortlist (Devlin 2017, "Sharp Models on Dull Hardware"):
each sentence chooses its output tokens among the special symbols, the ``n``
most frequent tokens and its own source tokens, and the verifier projects
only to those rows of the output matrix.

This is an *approximate* model, not greedy of the full one: a token outside
the shortlist is never produced, and log-probs are normalized over the
shortlist.  What stays exact is aggressive decoding *of that model*: IAD, GAD
and blockwise with ``--vocab-shortlist N`` give token for token the output of
greedy search with the same shortlist (``--decoding iad --max-draft-len 0``).
An exact shortlist cannot pay off here: every emitted token's log-prob needs
the log-sum-exp over the whole vocabulary, so the full projection would run
for every emitted position anyway.

fairseq dictionaries list the special symbols first and the other symbols by
descending frequency (``fairseq-preprocess``), so the common part is the id
range ``[0, nspecial + n)``; a joined dictionary counts both sides.
"""
from typing import List

import torch
from torch import Tensor

from .options import check_positive_int


class VocabShortlist:
    def __init__(self, src_dict, tgt_dict, n_frequent: int):
        n_frequent = check_positive_int(n_frequent, "--vocab-shortlist")
        self.vocab_size = len(tgt_dict)
        self.n_common = min(self.vocab_size, tgt_dict.nspecial + n_frequent)
        self.src_pad = src_dict.pad()
        # source id -> target id (by symbol; unknown symbols map to unk, which is common)
        if src_dict is tgt_dict or src_dict.symbols == tgt_dict.symbols:
            self.src_to_tgt = None
        else:
            self.src_to_tgt = torch.tensor([tgt_dict.index(sym) for sym in src_dict.symbols], dtype=torch.long)

    def extras(self, src_tokens: Tensor) -> List[List[int]]:
        """Per sentence (row of ``src_tokens``, padded), its target ids beyond
        the common ones, ascending."""
        rows = src_tokens.cpu().long()
        out = []
        for row in rows:
            ids = row[row.ne(self.src_pad)]
            if self.src_to_tgt is not None:
                ids = self.src_to_tgt[ids]
            ids = torch.unique(ids[(ids >= self.n_common) & (ids < self.vocab_size)])  # sorted
            out.append(ids.tolist())
        return out

    def allowed(self, src_tokens: Tensor) -> Tensor:
        """(B, V) bool: the tokens each sentence may produce."""
        mask = torch.zeros(src_tokens.size(0), self.vocab_size, dtype=torch.bool, device=src_tokens.device)
        mask[:, : self.n_common] = True
        for b, ids in enumerate(self.extras(src_tokens)):
            if ids:
                mask[b, torch.tensor(ids, device=src_tokens.device)] = True
        return mask
