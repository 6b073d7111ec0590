"""A ``block_nat`` drafter in the native engine (``fa_draft``,
csrc/loop/block_drafter.cpp): one call per drafting pass for all active sentences.

A ``--block-causal-prefix`` drafter keeps its prefix keys and values cached
across passes (a pass runs only the tokens emitted since the last one and the
``k`` slots); a bidirectional drafter runs its whole row each pass; a
``--feature-ar`` drafter runs the new tokens and then ``k`` one-token steps.  A
``--shared-encoder`` drafter starts from the verifier's encoder output,
another one runs its own encoder in the engine.  Proposals need not be exact:
exactness is the verifier's.
"""
import ctypes
from typing import List, Optional, Sequence

import numpy as np
import torch

from . import c_api
from .batch import StateHandle
from .build import NativeUnavailable
from .engine import NativeEngine


class NativeBlockDrafter:
    def __init__(self, model, tgt_dict, threads: Optional[int] = None, isa: Optional[str] = None):
        dec = model.decoder
        if getattr(dec, "src_copy", False):
            raise NativeUnavailable("--block-src-copy drafters run in torch")
        param = next(model.parameters())
        if param.device.type != "cpu":
            raise NativeUnavailable("the drafter is not on the CPU")
        if param.dtype != torch.float32:
            raise NativeUnavailable("the drafter is not float32")
        proj = getattr(dec, "feature_proj", None)
        self.feature_dim = 0 if proj is None else proj.in_features

        def prepare(engine):  # the block decoder's parts beyond a Transformer's
            mask = dec.mask_embed.detach().float().contiguous()
            if engine.lib.fa_set_mask_embed(engine.handle, mask.data_ptr()) != 0:
                raise engine.failure("the drafter's slot input")
            if proj is not None:  # the engine projects the verifier's features itself (no torch call per pass)
                w = proj.weight.detach().float().contiguous()
                b = proj.bias.detach().float().contiguous()
                if engine.lib.fa_set_feature_proj(engine.handle, w.data_ptr(), b.data_ptr(), self.feature_dim) != 0:
                    raise engine.failure("the drafter's feature projection")
            own = getattr(dec, "own_feature_proj", None)
            if own is not None:  # a drafter narrower than its verifier: its own outputs' projection
                w = own.weight.detach().float().contiguous()
                b = own.bias.detach().float().contiguous()
                if engine.lib.fa_set_own_feature_proj(engine.handle, w.data_ptr(), b.data_ptr()) != 0:
                    raise engine.failure("the drafter's projection of its own outputs")

        # drafters built one after another for one model (a hub model's translate()) share its weights
        self.engine = NativeEngine.for_model(model, tgt_dict, isa=isa, threads=threads, prepare=prepare,
                                             kind="block drafter")
        self.lib = self.engine.lib
        self.causal = bool(getattr(dec, "causal_prefix", False))
        # a --feature-ar drafter: k tokens one after the other from its own features (no slots)
        self.autoregressive = bool(getattr(model, "feature_ar", False))
        self.state = None
        self.cached: List[int] = []

    def positions(self) -> int:
        """Target positions the engine's tables cover."""
        return self.engine.tgt_positions

    def begin(self, src_tokens: torch.Tensor, encoder_out, max_len: int, k: int, shortlist=None) -> None:
        """Start a batch: from ``encoder_out`` (fairseq layout, the verifier's)
        when given, else with the drafter's own encoder.  ``shortlist`` (a
        :class:`~fairseq_aggressive.shortlist.VocabShortlist`): propose only
        its tokens (the frequent ones and each sentence's source tokens)."""
        cap = max_len + k + 2
        bsz = src_tokens.size(0)
        if encoder_out is None:
            self.state = self.engine.begin(src_tokens, max_len + k, shortlist)  # a NativeBatch
        else:
            enc = encoder_out["encoder_out"][0].detach().to(torch.float32).transpose(0, 1)  # B x S x C
            masks = encoder_out.get("encoder_padding_mask") or []
            keep = ~masks[0].cpu() if len(masks) > 0 else torch.ones(enc.shape[:2], dtype=torch.bool)
            flat = enc.cpu()[keep].contiguous()
            lengths = np.ascontiguousarray(keep.sum(1).numpy(), dtype=np.int32)
            handle = self.lib.fa_begin_encoded(self.engine.handle, bsz, flat.data_ptr(), lengths.ctypes.data, cap)
            if not handle:
                raise self.engine.failure("starting a drafter batch")
            self.state = StateHandle(self.lib, handle)
            if shortlist is not None:
                self.engine.set_shortlist(self.state.handle, shortlist, src_tokens)
        self.cached = [0] * bsz

    def starts(self, sents: Sequence[int]) -> List[int]:
        """Per sentence, the first row position the next :meth:`propose` sends
        (after the cached prefix of a causal drafter, else 0)."""
        return [self.cached[s] for s in sents] if self.causal else [0] * len(sents)

    def propose(self, sents: Sequence[int], rows: Sequence[List[int]], k: int,
                feats: Optional[torch.Tensor] = None, min_prob: float = 0.0) -> List[List[int]]:
        """``rows[i]``: sentence ``sents[i]``'s ``[bos] + output``; returns ``k``
        proposed ids per sentence (a ``--feature-ar`` drafter: up to its first
        EOS and, with ``min_prob``, its first token of a lower probability).
        ``feats``, for a ``--verifier-features`` drafter: float32 (tokens sent x
        its feature width), the verifier's features at the row positions sent
        (from :meth:`starts` on; zeros for BOS), rows concatenated."""
        n = len(sents)
        new = []
        for s, row in zip(sents, rows):
            new.append(row[self.cached[s]:] if self.causal else row)
        lens = np.array([len(t) for t in new], dtype=np.int32)
        flat = np.array([t for r in new for t in r] or [0], dtype=np.int32)
        sent = np.array(sents, dtype=np.int32)
        out = np.empty(n * k, dtype=np.int32)
        drafted = np.full(n, k, dtype=np.int32)
        if (feats is None) != (self.feature_dim == 0) or (
                feats is not None and (tuple(feats.shape) != (int(lens.sum()), self.feature_dim)
                                       or feats.dtype != torch.float32 or not feats.is_contiguous())):
            raise ValueError(f"native drafter: features {None if feats is None else tuple(feats.shape)} for "
                             f"{int(lens.sum())} tokens of width {self.feature_dim} (float32, contiguous)")
        args = c_api.DraftArgs(n=n, sent=sent.ctypes.data, row_len=lens.ctypes.data, tokens=flat.ctypes.data, k=k,
                               causal=int(self.causal), out=out.ctypes.data,
                               feats=None if feats is None else feats.data_ptr(),
                               autoregressive=int(self.autoregressive), min_prob=float(min_prob),
                               lens=drafted.ctypes.data)
        rc = self.lib.fa_draft(self.engine.handle, self.state.handle, ctypes.byref(args))
        if rc == -2:
            raise self.engine.failure("a drafter pass")
        if rc != 0:
            raise RuntimeError("native drafter: a row does not fit its sentence's cache")
        if self.causal:
            for s, row in zip(sents, rows):
                self.cached[s] = len(row)
        return [row[:length] for row, length in zip(out.reshape(n, k).tolist(), drafted.tolist())]
