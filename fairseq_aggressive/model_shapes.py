"""The model shapes each verifier runs exactly, described once: the torch
verifier's (:func:`check_supported`: a fairseq encoder-decoder Transformer whose
incremental decoding the cached decoder reproduces) and the native engine's
conditions (:func:`native_problems`: the same layer shapes throughout, no
projections or extras the engine does not compute).  A model outside the
native subset decodes with the torch verifier (the same output); one outside
the torch verifier's shapes is refused with the reasons."""
from typing import List

import torch

from .runtime.quantization import Int8Linear


class UnsupportedModelError(ValueError):
    pass


def _decoder_of(model):
    return getattr(model, "decoder", None)


def check_supported(model) -> None:
    """Raise :class:`UnsupportedModelError` unless the verifier can run ``model``
    exactly like fairseq's incremental decoder."""
    from fairseq.models.transformer import TransformerDecoderBase

    name = type(model).__name__
    dec = _decoder_of(model)
    if dec is None or getattr(model, "encoder", None) is None:
        raise UnsupportedModelError(
            f"aggressive decoding needs an encoder-decoder model, got {name}"
        )
    try:
        from fairseq.models.nat import FairseqNATModel

        if isinstance(model, FairseqNATModel):
            raise UnsupportedModelError(
                f"{name} is non-autoregressive; aggressive decoding verifies with an "
                "autoregressive Transformer (--arch transformer*)"
            )
    except ImportError:  # pragma: no cover - nat models always ship with fairseq
        pass
    if getattr(model, "is_block_drafter", False):
        raise UnsupportedModelError(
            f"{name} is a non-autoregressive block drafter; pass it as --drafter-path and "
            "decode with an autoregressive verifier (--decoding gad)"
        )
    if not isinstance(dec, TransformerDecoderBase):
        raise UnsupportedModelError(
            f"aggressive decoding supports fairseq Transformer decoders; {name} has a "
            f"{type(dec).__name__}"
        )
    problems = []
    if dec.adaptive_softmax is not None:
        problems.append("adaptive softmax")
    if dec.cross_self_attention:
        problems.append("cross-self-attention")
    if getattr(dec, "quant_noise", None) is not None:
        problems.append("quant-noise on embeddings")
    for i, layer in enumerate(dec.layers):
        if not hasattr(layer, "self_attn") or not hasattr(layer, "fc1"):
            problems.append(f"layer {i} is not a standard decoder layer")
            continue
        sa = layer.self_attn
        if sa.bias_k is not None or sa.add_zero_attn:
            problems.append(f"layer {i}: self-attention with add_bias_kv/add_zero_attn")
        if getattr(layer, "cross_self_attention", False):
            problems.append(f"layer {i}: cross-self-attention")
        if layer.encoder_attn is None:
            problems.append(f"layer {i}: no encoder attention")
        elif layer.encoder_attn.bias_k is not None or layer.encoder_attn.add_zero_attn:
            problems.append(f"layer {i}: encoder attention with add_bias_kv/add_zero_attn")
    if problems:
        raise UnsupportedModelError(
            "the aggressive verifier cannot run this decoder exactly ("
            + "; ".join(problems)
            + "); decode it with --decoding beam instead"
        )


def activation(layer) -> str:
    """The name of a layer's activation function (relu, gelu, ...)."""
    return getattr(layer.activation_fn, "__name__", "")


def native_problems(model) -> List[str]:
    """Why the native engine cannot compute ``model`` exactly as fairseq's
    standard Transformer layers do (empty: it can).  A verifier must also pass
    :func:`check_supported`; a block drafter, which the engine runs too, need not."""
    from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase

    from fairseq.modules import TransformerDecoderLayer, TransformerEncoderLayer

    enc, dec = getattr(model, "encoder", None), getattr(model, "decoder", None)
    if not isinstance(enc, TransformerEncoderBase) or not isinstance(dec, TransformerDecoderBase):
        return [f"{type(model).__name__} is not a standard fairseq Transformer"]
    C, E = dec.embed_dim, enc.embed_tokens.embedding_dim
    # a --shared-encoder drafter narrower than its verifier: the engine runs its
    # decoder over the verifier's encoder output (E wide) and never its encoder
    own_encoder = E == C or not getattr(model, "shared_encoder", False)
    problems = []
    if (own_encoder and E != C) or dec.output_embed_dim != C:
        problems.append("embedding, encoder and output dimensions differ")
    if dec.project_in_dim is not None or dec.project_out_dim is not None:
        problems.append("decoder input/output projections")
    if dec.adaptive_softmax is not None or not isinstance(dec.output_projection, (torch.nn.Linear, Int8Linear)):
        problems.append("adaptive softmax")
    if getattr(enc, "quant_noise", None) is not None or getattr(dec, "quant_noise", None) is not None:
        problems.append("quant-noise")
    if own_encoder and (enc.embed_positions is not None and dec.embed_positions is None or (
            enc.embed_positions is None and dec.embed_positions is not None)):
        problems.append("positions in only one of encoder and decoder")
    layers = (list(enc.layers) if own_encoder else []) + list(dec.layers)
    heads = {l.self_attn.num_heads for l in layers}
    ffn = {l.fc1.out_features for l in layers}
    acts = {activation(l) for l in layers}
    norms = {l.self_attn_layer_norm.eps for l in layers}
    if len(heads) != 1 or len(ffn) != 1:
        problems.append("layers with different head counts or FFN sizes")
    if not acts <= {"relu", "gelu", "silu"}:
        problems.append(f"activation {sorted(acts)}")
    if len(norms) != 1:
        problems.append("layer norms with different eps")
    for i, l in enumerate(layers):
        if type(l) not in (TransformerEncoderLayer, TransformerDecoderLayer) and not type(l).__name__.endswith("LayerBase"):
            problems.append(f"layer {i} is a {type(l).__name__}")
        for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid"):
            if getattr(l, name, None) is not None:
                problems.append(f"normformer extras ({name})")
        attns = [(l.self_attn, C)]
        if getattr(l, "encoder_attn", None) is not None:
            attns.append((l.encoder_attn, E))
        for a, key_dim in attns:
            if a.bias_k is not None or a.add_zero_attn or a.embed_dim != C or a.kdim != key_dim or a.vdim != key_dim:
                problems.append(f"layer {i}: non-standard attention")
    return sorted(set(problems))
