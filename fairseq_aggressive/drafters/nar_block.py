"""NAR block drafter (GAD, Xia et al. 2023): a ``block_nat`` model proposes
the next ``k`` tokens after the current prefix in one parallel pass.

The drafter encodes the source once per batch with its own encoder, or reads
the verifier's encoder output (a ``--shared-encoder`` drafter: one encoder run
per sentence); per iteration it runs its decoder over ``[bos, prefix, M x k]``
for all still-active sentences at once and projects only the ``k`` slots.
"""
from typing import List, Optional

import torch

from ..options import check_positive_int
from .base import Drafter


class NARBlockDrafter(Drafter):
    def __init__(self, model, tgt_dict, block_size: int, fast: bool = True):
        self.k = check_positive_int(block_size, "--block-size")
        self.model = model.eval()
        self.pad, self.eos = tgt_dict.pad(), tgt_dict.eos()
        self.bos = self.eos
        self.slot_id = tgt_dict.unk()  # any non-pad id: slot embeddings are replaced
        self.max_positions = model.decoder.max_positions()
        # fused inference path for real block_nat decoders (stand-ins use block_logits)
        self.fast = hasattr(model.decoder, "fast_block_features") and fast
        # a --shared-encoder drafter reads the verifier's encoder output (the generator passes it)
        self.needs_encoder_out = bool(getattr(model, "shared_encoder", False))
        self.encoder_out = None
        self._rows: Optional[List[int]] = None
        self._enc_rows = None

    @torch.no_grad()
    def begin(self, sample, encoder_out=None) -> None:
        net_input = sample["net_input"]
        if self.needs_encoder_out:
            if encoder_out is None:
                raise ValueError("this drafter reads the verifier's encoder output (--shared-encoder): "
                                 "the generator must pass it to begin()")
            self.encoder_out = self._with_embedding(encoder_out, net_input["src_tokens"])
        else:
            self.encoder_out = self.model.encoder(
                net_input["src_tokens"], src_lengths=net_input["src_lengths"]
            )
        self._rows, self._enc_rows = None, self.encoder_out
        self.enc_kv = self._enc_kv_rows = None
        if self.fast:
            from ..layer_ops import encoder_kv

            self.enc_kv = self._enc_kv_rows = encoder_kv(self.model.decoder.layers, self.encoder_out)

    def _with_embedding(self, encoder_out, src_tokens):
        """The verifier's encoder output, in the drafter's dtype, plus the source
        token embeddings a ``--block-src-copy`` decoder reads (the drafter's own
        frozen copy of the shared embeddings)."""
        param = next(self.model.decoder.parameters())
        out = dict(encoder_out)
        out["encoder_out"] = [encoder_out["encoder_out"][0].to(device=param.device, dtype=param.dtype)]
        if getattr(self.model.decoder, "src_copy", False):
            enc = self.model.encoder
            out["encoder_embedding"] = [enc.embed_scale * enc.embed_tokens(src_tokens.to(param.device))]
        return out

    def propose(self, sent: int, output: List[int], cap: int) -> List[int]:
        return self.propose_batch([sent], [output], [cap])[0]

    def _encoder_rows(self, sents: List[int]):
        if self._rows is None and sents == list(range(len(sents))) and \
                len(sents) == self.encoder_out["encoder_out"][0].size(1):
            self._rows = list(sents)  # the whole batch: no reordering
        if sents != self._rows:  # sentences finished since the last call
            idx = torch.tensor(sents, dtype=torch.long, device=self.encoder_out["encoder_out"][0].device)
            self._enc_rows = self.model.encoder.reorder_encoder_out(self.encoder_out, idx)
            if self.enc_kv is not None:
                k, v, m = self.enc_kv
                self._enc_kv_rows = ([t.index_select(0, idx) for t in k], [t.index_select(0, idx) for t in v],
                                     None if m is None else m.index_select(0, idx))
            self._rows = list(sents)
        return self._enc_rows

    @torch.no_grad()
    def propose_batch(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[int]]:
        # bos + prefix + slots must fit the drafter's positions
        ks = [min(self.k, c, self.max_positions - 1 - len(o)) for c, o in zip(caps, outputs)]
        if max(ks) <= 0:
            return [[] for _ in sents]
        k = max(ks)
        width = 1 + max(len(o) for o in outputs) + k
        rows, slot_rows = [], []
        for out in outputs:
            n = 1 + len(out)
            rows.append([self.bos] + out + [self.slot_id] * k + [self.pad] * (width - n - k))
            slot_rows.append([False] * n + [True] * k + [False] * (width - n - k))
        device = self.encoder_out["encoder_out"][0].device
        tokens = torch.tensor(rows, dtype=torch.long, device=device)
        slots = torch.tensor(slot_rows, dtype=torch.bool, device=device)
        enc = self._encoder_rows(sents)
        if self.fast:
            feats = self.model.decoder.fast_block_features(tokens, slots, enc, self._enc_kv_rows)
            logits = self.model.decoder.output_layer(feats[slots])
        else:
            logits = self.model.block_logits(tokens, slots, enc)
        logits[:, self.pad] = -float("inf")
        pred = logits.argmax(-1).view(len(sents), k).tolist()
        drafts = []
        for p, kk in zip(pred, ks):
            p = p[: max(kk, 0)]
            if self.eos in p:  # nothing follows the end of the sentence
                p = p[: p.index(self.eos) + 1]
            drafts.append(p)
        return drafts
