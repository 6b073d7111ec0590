"""fairseq ``TransformerDecoderLayerBase`` arithmetic, shared by the verifier
(causal attention over a rollback-able cache) and the block drafter's inference
path (bidirectional attention): the same parameters and the same operations in
the same order as the stock layer, with the self-attention core supplied by the
caller and the encoder-attention keys/values computed once per batch."""
import contextlib
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def attention_backends(device: torch.device, dtype: torch.dtype):
    """The scaled-dot-product-attention backends for decoding passes on ``device`` in ``dtype``
    (None: torch's own choice).  On CUDA in float16 and bfloat16, every backend but cuDNN's: a
    decoding pass's attention changes shape from call to call (new positions x cached keys, a
    mask), and cuDNN's attention builds an execution plan for each new shape, which costs far
    more than the attention itself (docs/results-gpu.md).  The memory-efficient kernel takes
    any shape and mask; flash takes the unmasked calls.  Float32 has no cuDNN attention."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return None
    from torch.nn.attention import SDPBackend

    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_scope(backends):
    """A context that holds scaled-dot-product attention to ``backends`` (None: no limit)."""
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backends)


def position_table(emb, n: int, device=None) -> Optional[Tensor]:
    """The rows fairseq's positional embedding ``emb`` adds at steps 0 .. n-1
    of a sequence without padding (n x C; None without positions)."""
    if emb is None:
        return None
    pad = emb.padding_idx if emb.padding_idx is not None else -1
    with torch.no_grad():
        return emb(torch.full((1, n), pad + 1, dtype=torch.long, device=device))[0]


def encoder_kv(layers, encoder_out) -> Tuple[List[Tensor], List[Tensor], Optional[Tensor]]:
    """Per layer encoder-attention keys and values (B, H, S, D) and the key mask
    (B, 1, 1, S), True = attend (None without padding)."""
    enc = encoder_out["encoder_out"][0]  # S x B x C
    pads = encoder_out["encoder_padding_mask"]
    pad_mask = pads[0] if len(pads) > 0 else None
    S, B, _ = enc.shape
    enc_bt = enc.transpose(0, 1)
    enc_k, enc_v = [], []
    for layer in layers:
        ea = layer.encoder_attn
        H, D = ea.num_heads, ea.head_dim
        enc_k.append(ea.k_proj(enc_bt).view(B, S, H, D).transpose(1, 2))
        enc_v.append(ea.v_proj(enc_bt).view(B, S, H, D).transpose(1, 2))
    enc_mask = None
    if pad_mask is not None and bool(pad_mask.any()):
        enc_mask = (~pad_mask).view(B, 1, 1, S)
    return enc_k, enc_v, enc_mask


def decoder_layer(layer, x: Tensor, self_attention: Callable[[Tensor, Tensor, Tensor], Tensor],
                  enc_k: Tensor, enc_v: Tensor, enc_mask: Optional[Tensor], train: bool = False) -> Tensor:
    """One decoder layer on ``x`` (B, T, C).  ``self_attention(q, k, v)`` gets
    q (B, H, T, D, already scaled) and k, v (B, T, H, D) and returns (B, H, T, D).
    ``train``: the layer's dropout where the stock layer applies it (the
    self-attention core's own dropout is the caller's)."""
    drop = layer.dropout_module if train else (lambda t: t)
    B, T, _ = x.shape
    sa = layer.self_attn
    H, D = sa.num_heads, sa.head_dim
    residual = x
    if layer.normalize_before:
        x = layer.self_attn_layer_norm(x)
    q = (sa.q_proj(x) * sa.scaling).view(B, T, H, D).transpose(1, 2)
    k = sa.k_proj(x).view(B, T, H, D)
    v = sa.v_proj(x).view(B, T, H, D)
    a = self_attention(q, k, v)
    x = sa.out_proj(a.transpose(1, 2).reshape(B, T, H * D))
    if layer.c_attn is not None:
        x = torch.einsum("bthd,h->bthd", x.view(B, T, layer.nh, layer.head_dim), layer.c_attn)
        x = x.reshape(B, T, -1)
    if layer.attn_ln is not None:
        x = layer.attn_ln(x)
    x = layer.residual_connection(drop(x), residual)
    if not layer.normalize_before:
        x = layer.self_attn_layer_norm(x)

    ea = layer.encoder_attn
    residual = x
    if layer.normalize_before:
        x = layer.encoder_attn_layer_norm(x)
    q = (ea.q_proj(x) * ea.scaling).view(B, T, H, D).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, enc_k, enc_v, attn_mask=enc_mask, scale=1.0,
                                       dropout_p=ea.dropout_module.p if train else 0.0)
    x = drop(ea.out_proj(a.transpose(1, 2).reshape(B, T, H * D)))
    x = layer.residual_connection(x, residual)
    if not layer.normalize_before:
        x = layer.encoder_attn_layer_norm(x)

    residual = x
    if layer.normalize_before:
        x = layer.final_layer_norm(x)
    x = layer.activation_fn(layer.fc1(x))
    if train:
        x = layer.activation_dropout_module(x)
    if layer.ffn_layernorm is not None:
        x = layer.ffn_layernorm(x)
    x = drop(layer.fc2(x))
    if layer.w_resid is not None:
        residual = torch.mul(layer.w_resid, residual)
    x = layer.residual_connection(x, residual)
    if not layer.normalize_before:
        x = layer.final_layer_norm(x)
    return x
