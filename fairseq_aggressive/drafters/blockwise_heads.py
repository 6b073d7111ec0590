"""Blockwise parallel decoding's drafter (Stern et al. 2018): the proposal heads
of a ``transformer_blockwise`` verifier.

Predict and verify are merged: the verifier's pass of iteration n computes the
decoder features of every drafted position anyway; the heads 2..k applied to
the features that chose the last emitted token propose the next block (head 1
is the verifier's own top-1, which the generator emits).  So after the first
pass (which drafts nothing) every iteration is one model invocation plus the
heads on one feature row per sentence.  Both verifiers hand over those
features (the native engine's are its own: proposals may differ from torch's
by rounding, the output is the verifier's greedy either way).
"""
from typing import List, Optional

import torch

from .base import Branch, Drafter, DrafterCaps, EngineDrafter, LoopResult, drafts_as, single_drafts


class BlockwiseHeadsDrafter(Drafter):
    caps = DrafterCaps(emitted_features=True)

    def __init__(self, model, tgt_dict):
        if not getattr(model, "has_blockwise_heads", False):
            raise ValueError(
                f"--decoding blockwise needs a model with proposal heads (--arch "
                f"transformer_blockwise), got a {type(model).__name__}; decode it with --decoding beam"
            )
        self.model = model
        self.pad = tgt_dict.pad()
        self.proposals: List[List[int]] = []

    def begin(self, sample, max_len: int, encoder_out=None) -> None:
        self.proposals = [[] for _ in range(sample["net_input"]["src_tokens"].size(0))]

    def propose(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        return single_drafts([self.proposals[s][: max(c, 0)] for s, c in zip(sents, caps)])

    def engine_drafter(self, verifier) -> Optional[EngineDrafter]:
        # the engine's blockwise drafter proposes with the heads of the model it verifies with, as
        # observe_emitted() here
        as_here = drafts_as(self, BlockwiseHeadsDrafter, ("propose", "observe_emitted", "update", "begin"))
        if not as_here or getattr(getattr(verifier, "engine", None), "n_heads", 0) != self.model.blockwise_k - 1:
            return None
        return EngineDrafter("blockwise")

    def decode_in_engine(self, verifier, sample, max_len: int, first: int, max_draft) -> Optional[LoopResult]:
        spec = self.engine_drafter(verifier)
        if spec is None or not verifier.runs_engine_loops:
            return None
        toks, scores, passes, st = verifier.decode_in_engine(spec.kind, first, max_draft, **spec.settings)
        return LoopResult(toks, scores, passes, st.loop)

    @torch.no_grad()
    def observe_emitted(self, sents: List[int], feats, n_emit) -> None:
        """``feats`` (sum of ``n_emit`` x C): the features that chose each
        emitted token, sentence after sentence; the heads read each sentence's last."""
        last = torch.tensor(n_emit, device=feats.device).cumsum(0) - 1
        param = next(self.model.parameters())
        logits = self.model.head_logits(feats.index_select(0, last).to(device=param.device, dtype=param.dtype))
        logits[..., self.pad] = -float("inf")  # (B, k-1, V)
        for s, row in zip(sents, logits.argmax(-1).tolist()):
            self.proposals[s] = row


def build_blockwise(opts, task, models):
    """``--decoding blockwise``: (the model's heads, exact, top-K or minimum-block acceptance)."""
    from ..acceptance import build_blockwise_acceptance

    drafter = BlockwiseHeadsDrafter(models[0], task.target_dictionary)
    return drafter, build_blockwise_acceptance(opts.blockwise_topk, opts.min_block_size,
                                               block_size=models[0].blockwise_k)
