"""The verifier: a stock fairseq Transformer decoder run over several new
positions per call on top of a per-sentence key/value cache.

fairseq's incremental decoding feeds one token per step.  Aggressive decoding
needs to score a whole draft in one pass and to throw away the cache entries of
rejected draft tokens.  This module runs the decoder's own sub-modules (the
same parameters, the same operations in the same order as
``TransformerDecoderLayerBase.forward``) with:

* a preallocated self-attention cache ``(B, H, L, D)`` per layer, written at each
  sentence's own offset, so sentences in a batch may have accepted different
  numbers of tokens (ragged acceptance);
* a causal mask over the new positions;
* rollback by moving a length pointer (no recomputation, no copies);
* encoder-attention keys/values computed once per batch;
* attention held to the backends of :func:`attention_backends`.

Decoder configurations whose incremental semantics we do not reproduce
exactly are refused by :func:`~fairseq_aggressive.model_shapes.check_supported`
with a clear message.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model_shapes import check_supported
from ..runtime.layer_ops import attention_backends, attention_scope, decoder_layer, encoder_kv, position_table


class VerifierState:
    """Per-batch decoding state: caches and per-sentence lengths."""

    def __init__(self, enc_k, enc_v, enc_mask, self_k, self_v, lengths):
        self.enc_k: List[Tensor] = enc_k  # per layer (B, H, S, D)
        self.enc_v: List[Tensor] = enc_v
        self.enc_mask: Optional[Tensor] = enc_mask  # (B, 1, 1, S) bool, True = attend
        self.self_k: List[Tensor] = self_k  # per layer (B, H, L, D)
        self.self_v: List[Tensor] = self_v
        self.lengths: Tensor = lengths  # (B,) cached positions per sentence

    def select(self, idx: Tensor) -> None:
        """Keep only the sentences ``idx`` (finished ones stop costing compute)."""
        pick = lambda ts: [t.index_select(0, idx) for t in ts]  # noqa: E731
        self.enc_k, self.enc_v = pick(self.enc_k), pick(self.enc_v)
        self.self_k, self.self_v = pick(self.self_k), pick(self.self_v)
        if self.enc_mask is not None:
            self.enc_mask = self.enc_mask.index_select(0, idx)
        self.lengths = self.lengths.index_select(0, idx)


class CachedDecoderVerifier:
    """Scores many new decoder positions per call for one fairseq Transformer."""

    def __init__(self, model):
        check_supported(model)
        self.model = model
        self.dec = model.decoder
        layer0 = self.dec.layers[0]
        self.num_heads = layer0.self_attn.num_heads
        self.head_dim = layer0.self_attn.head_dim
        self._pos_table: Optional[Tensor] = None
        # backends a pass's attention may use; "auto": :func:`attention_backends` of the
        # pass's device and dtype; None: torch's choice; or a list of SDPBackend
        self.attention_backends = "auto"

    # ------------------------------------------------------------------ setup
    def encode(self, net_input):
        return self.model.encoder.forward_torchscript(net_input)

    def _positions(self, n: int, like: Tensor) -> Optional[Tensor]:
        """Positional embeddings of decoder positions 0..n-1, shape (n, C)."""
        emb = self.dec.embed_positions
        if emb is None:
            return None
        table = self._pos_table
        if table is None or table.size(0) < n or table.device != like.device:
            table = position_table(emb, n, like.device).to(like.dtype)
            self._pos_table = table
        return table

    def begin(self, encoder_out, max_positions: int) -> VerifierState:
        """Precompute encoder-attention keys/values and allocate the self-attention
        cache for ``max_positions`` decoder positions."""
        enc = encoder_out["encoder_out"][0]  # S x B x C
        enc_k, enc_v, enc_mask = encoder_kv(self.dec.layers, encoder_out)
        B = enc.size(1)
        H, D = self.num_heads, self.head_dim
        L = max_positions + 1  # one spare slot for padding positions of ragged drafts
        self_k = [enc.new_zeros(B, H, L, D) for _ in self.dec.layers]
        self_v = [enc.new_zeros(B, H, L, D) for _ in self.dec.layers]
        lengths = torch.zeros(B, dtype=torch.long, device=enc.device)
        self._positions(max_positions, enc)
        return VerifierState(enc_k, enc_v, enc_mask, self_k, self_v, lengths)

    # ---------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(self, state: VerifierState, tokens: Tensor, valid: Tensor) -> Tensor:
        """Run the decoder over ``tokens`` (B x T), placed right after each
        sentence's cached positions.  ``valid`` (B,) is how many of the T tokens
        are real for each sentence (the rest is padding whose outputs are junk).

        Returns the decoder features (B x T x C) before the output projection.
        The cache receives keys/values of all T positions; call :meth:`commit`
        afterwards to keep only the accepted ones.
        """
        dec = self.dec
        B, T = tokens.shape
        L = state.self_k[0].size(2)
        spare = L - 1
        pos = state.lengths.unsqueeze(1) + torch.arange(T, device=tokens.device)
        # padding slots all go to the spare slot at the end of the cache
        pad_slot = torch.arange(T, device=tokens.device).unsqueeze(0) >= valid.unsqueeze(1)
        pos = pos.masked_fill(pad_slot, spare)

        x = dec.embed_scale * dec.embed_tokens(tokens)
        if dec.project_in_dim is not None:
            x = dec.project_in_dim(x)
        table = self._positions(spare, x)
        if table is not None:
            x = x + table[pos.clamp(max=table.size(0) - 1)]
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)

        n_keys = int(state.lengths.max()) + T
        if n_keys > spare:
            n_keys = L
        keys = torch.arange(n_keys, device=tokens.device)
        # query (b, t) sees key j iff j <= its position (causal over old + new)
        attn_mask = (keys.view(1, 1, -1) <= pos.unsqueeze(2)).unsqueeze(1)
        uniform = B == 1 or bool((pad_slot.sum(1) == 0).all() and (state.lengths == state.lengths[0]).all())
        start = int(state.lengths[0]) if uniform else 0

        backends = self.attention_backends
        if backends == "auto":
            backends = attention_backends(x.device, x.dtype)
        with attention_scope(backends):
            x = self._layers(state, x, T, pos, n_keys, attn_mask, uniform, start)

        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        return x

    def _layers(self, state, x, T, pos, n_keys, attn_mask, uniform, start):
        B = x.size(0)
        bidx = torch.arange(B, device=x.device).unsqueeze(1).expand(B, T)
        for li, layer in enumerate(self.dec.layers):
            ck, cv = state.self_k[li], state.self_v[li]

            def cached_attention(q, k, v, ck=ck, cv=cv):
                if uniform:
                    ck[:, :, start : start + T] = k.transpose(1, 2)
                    cv[:, :, start : start + T] = v.transpose(1, 2)
                else:
                    ck[bidx, :, pos] = k
                    cv[bidx, :, pos] = v
                return F.scaled_dot_product_attention(
                    q, ck[:, :, :n_keys], cv[:, :, :n_keys], attn_mask=attn_mask, scale=1.0
                )

            x = decoder_layer(layer, x, cached_attention, state.enc_k[li], state.enc_v[li], state.enc_mask)
        return x

    def output_layer(self, features: Tensor) -> Tensor:
        return self.dec.output_layer(features)

    @staticmethod
    def commit(state: VerifierState, kept: Tensor) -> None:
        """Keep the first ``kept[b]`` of the positions fed in the last call
        (rollback of the rest is just not advancing the length pointer)."""
        state.lengths += kept
