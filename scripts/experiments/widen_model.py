"""Widen a trained pre-norm Transformer checkpoint to a larger width with the
same function: a model of the larger size's layer shapes (d=1024, 16 heads,
ffn 4096: Transformer-big's) that copies exactly as the trained model does,
for measuring decoding speed at that size without training it there.

    python scripts/experiments/widen_model.py models/uagec-9x3/model.pt work/wide/d1024.pt \\
        --dim 1024 --ffn 4096 --heads 16

Every hidden vector of the wide model holds each value of the narrow one
``r = dim / d`` times, laid out so that each wide attention head holds ``c``
copies of one narrow head's dimensions (``c`` = wide head size / narrow head
size; queries scaled to keep the attention weights).  Linear layers read the
copies with weights ``(1 +- 0.1) / r`` (they sum to one, so the outputs are
the narrow layer's; the uneven split keeps the weights from being exact
float16 values, as a trained float32 model's are not).  Layer norms see the
same mean and variance; the decoder's last layer norm is scaled by
``1 / sqrt(r)`` so that the shared output projection gives the narrow logits.
Sinusoidal positions depend on the width, so the wide model has learned
positions holding the narrow model's sinusoids.

The outputs equal the narrow model's up to float rounding (the script checks
the logits on a few rows).  Needs a pre-norm model with shared embeddings.

``--drafter D --drafter-out OUT`` also makes a ``--shared-encoder`` drafter
trained for the narrow model (a ``--feature-ar`` or GAD block drafter) read the
wide one: its decoder stays narrow and gets the wide encoder (the wide model's,
shared) and, for a ``--verifier-features`` drafter, the wide features, read
with the same copy weights, so it proposes what it proposes beside the narrow
model (a feature drafter gets its own projection of its own outputs, the
narrow one's).  That is a drafter narrower than its verifier, whose draft steps
cost a narrow model's:

    python scripts/experiments/widen_model.py STUDENT.pt work/wide/student-d512.pt \
        --dim 512 --ffn 2048 --heads 8 --drafter DRAFTER.pt --drafter-out work/wide/drafter-for-d512.pt
"""
import argparse
import copy
import math
import os
import sys

import torch


def layout(d: int, heads: int, dim: int, wide_heads: int) -> torch.Tensor:
    """For each wide dimension, the narrow dimension it holds."""
    hd, whd = d // heads, dim // wide_heads
    if d % heads or dim % wide_heads or whd % hd or wide_heads % heads:
        raise SystemExit(f"error: cannot widen {heads} heads of {hd} to {wide_heads} heads of {whd} "
                         "(the wide head size must be a multiple of the narrow one, and the wide head "
                         "count a multiple of the narrow one)")
    i = torch.arange(dim)
    head, within = i // whd, i % whd
    return (head % heads) * hd + within % hd


def copy_weights(where: torch.Tensor, copies: int) -> torch.Tensor:
    """For each wide dimension holding narrow dimension ``where[i]``: the weight
    a linear layer reads it with, (1 +- 0.1) / copies over the copies of one
    narrow dimension (summing to one; an odd copy count leaves the last at 1)."""
    rank = torch.zeros_like(where)
    seen = {}
    for i, m in enumerate(where.tolist()):
        rank[i] = seen.get(m, 0)
        seen[m] = rank[i].item() + 1
    sign = torch.where(rank % 2 == 0, 1.0, -1.0)
    if copies % 2:
        sign[rank == copies - 1] = 0.0
    return (1.0 + 0.1 * sign) / copies


def sinusoids(num: int, d: int, padding_idx: int) -> torch.Tensor:
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

    return SinusoidalPositionalEmbedding.get_embedding(num, d, padding_idx).float()


def widen(state, dim: int, ffn: int, wide_heads: int):
    args = model_args(state)
    if not (args.encoder_normalize_before and args.decoder_normalize_before and args.share_all_embeddings):
        raise SystemExit("error: widening needs a pre-norm model with --share-all-embeddings")
    if args.encoder_learned_pos or args.decoder_learned_pos or getattr(args, "layernorm_embedding", False):
        raise SystemExit("error: widening expects sinusoidal positions and no embedding layer norm")
    d, f = args.encoder_embed_dim, args.encoder_ffn_embed_dim
    if args.decoder_embed_dim != d or args.decoder_ffn_embed_dim != f or \
            args.encoder_attention_heads != args.decoder_attention_heads:
        raise SystemExit("error: widening expects the same width, ffn and heads in encoder and decoder")
    if dim % d or ffn % f:
        raise SystemExit(f"error: --dim must be a multiple of {d} and --ffn of {f}")
    heads = args.encoder_attention_heads
    r, rf = dim // d, ffn // f
    hmap = layout(d, heads, dim, wide_heads)
    fmap = torch.arange(ffn) % f
    hw, fw = copy_weights(hmap, r), copy_weights(fmap, rf)
    q_scale = math.sqrt(dim // wide_heads) / ((dim // wide_heads) // (d // heads) * math.sqrt(d // heads))
    src = state["model"]
    out = {}
    for name, t in src.items():
        if name.endswith(".version"):
            out[name] = t
            continue
        base, _, kind = name.rpartition(".")
        if name.endswith("embed_tokens.weight") or name == "decoder.output_projection.weight":
            out[name] = t.float()[:, hmap] * math.sqrt(d / dim)
        elif "layer_norm" in base:
            v = t.float()[hmap]
            out[name] = v / math.sqrt(r) if base == "decoder.layer_norm" else v
        elif base.endswith(("fc1", "fc2")) or (base.endswith("_proj") and "attn" in base):
            # a linear layer: rows by the output's layout, columns by the input's, read with the copy weights
            rows, cols, reads = (fmap, hmap, hw) if base.endswith("fc1") else \
                (hmap, fmap, fw) if base.endswith("fc2") else (hmap, hmap, hw)
            scale = q_scale if base.endswith("q_proj") else 1.0
            v = t.float()[rows]
            out[name] = (v[:, cols] * reads.unsqueeze(0) if kind == "weight" else v) * scale
        else:
            raise SystemExit(f"error: do not know how to widen {name} {tuple(t.shape)}")
    pad = 1
    for side, n in (("encoder", args.max_source_positions), ("decoder", args.max_target_positions)):
        table = sinusoids(n + pad + 1, d, pad)
        out[f"{side}.embed_positions.weight"] = table[:, hmap]
    args.encoder_embed_dim = args.decoder_embed_dim = dim
    args.decoder_output_dim = args.decoder_input_dim = dim
    args.encoder_ffn_embed_dim = args.decoder_ffn_embed_dim = ffn
    args.encoder_attention_heads = args.decoder_attention_heads = wide_heads
    args.encoder_learned_pos = args.decoder_learned_pos = True
    return checkpoint_like(state, args, out)


def model_args(state):
    """A copy of a checkpoint's model configuration (an argparse namespace)."""
    return copy.deepcopy(state["args"] if state.get("args") is not None else state["cfg"]["model"])


def checkpoint_like(state, args, tensors):
    """A checkpoint as ``state`` (its other entries, no optimizer state) with
    model configuration ``args`` and parameters ``tensors``."""
    result = {k: v for k, v in state.items() if k not in ("model", "last_optimizer_state")}
    result["model"] = tensors
    if state.get("args") is not None:
        result["args"] = args
    else:
        result["cfg"] = dict(state["cfg"])
        result["cfg"]["model"] = args
    return result


def drafter_for_wide(drafter, wide, narrow_args, dim: int, wide_heads: int, wide_path: str):
    """The narrow ``drafter`` checkpoint (trained beside the narrow model)
    made to read the ``wide`` checkpoint's encoder output and features."""
    dargs = model_args(drafter)
    if not getattr(dargs, "shared_encoder", False):
        raise SystemExit("error: --drafter must be a --shared-encoder drafter (it reads the verifier's encoder output)")
    d, heads = narrow_args.encoder_embed_dim, narrow_args.encoder_attention_heads
    if dargs.encoder_embed_dim != d or dargs.decoder_embed_dim != d:
        raise SystemExit(f"error: the drafter is not as wide as the narrow model ({d})")
    r = dim // d
    hmap = layout(d, heads, dim, wide_heads)
    hw = copy_weights(hmap, r)
    out = {k: v for k, v in wide["model"].items() if k.startswith("encoder.")}
    for name, t in drafter["model"].items():
        if name.startswith("encoder."):
            continue
        if name == "decoder.embed_tokens.weight" or name == "decoder.output_projection.weight":
            out[name] = t.float()
        elif name.endswith(("encoder_attn.k_proj.weight", "encoder_attn.v_proj.weight")):
            out[name] = t.float()[:, hmap] * hw.unsqueeze(0)  # reads each copy of the encoder output
        elif name == "decoder.feature_proj.weight":
            # the wide features are the narrow ones repeated and scaled by 1 / sqrt(r) (the last layer norm)
            out[name] = t.float()[:, hmap] * hw.unsqueeze(0) * math.sqrt(r)
        else:
            out[name] = t.float() if t.is_floating_point() else t
    if "decoder.embed_tokens.weight" not in out:  # shared with the narrow encoder's embeddings
        out["decoder.embed_tokens.weight"] = drafter["model"]["encoder.embed_tokens.weight"].float()
    if getattr(dargs, "feature_ar", False):
        out["decoder.own_feature_proj.weight"] = drafter["model"]["decoder.feature_proj.weight"].float()
        out["decoder.own_feature_proj.bias"] = drafter["model"]["decoder.feature_proj.bias"].float()
    dargs.encoder_embed_dim = dim
    dargs.encoder_ffn_embed_dim = model_args(wide).encoder_ffn_embed_dim
    dargs.encoder_attention_heads = wide_heads
    dargs.encoder_learned_pos = True
    dargs.share_all_embeddings = False
    dargs.share_decoder_input_output_embed = True
    dargs.decoder_input_dim = dargs.decoder_output_dim = d
    dargs.encoder_initialized_from = wide_path
    return checkpoint_like(drafter, dargs, out)


def check(narrow_path: str, wide_path: str, data: str):
    """Largest difference of the two models' log-probabilities on a few target
    rows of ``data``'s test split, and whether their argmax agrees everywhere
    (a sanity check of the construction)."""
    from fairseq import checkpoint_utils

    import fairseq_aggressive  # noqa: F401  (the task and the checkpoint loading)

    (narrow,), _, task = checkpoint_utils.load_model_ensemble_and_task([narrow_path], arg_overrides={"data": data})
    (wide,), _ = checkpoint_utils.load_model_ensemble([wide_path], task=task)
    task.load_dataset("test")
    ds = task.dataset("test")
    batch = ds.collater([ds[i] for i in range(8)])
    with torch.no_grad():
        a = narrow.float().eval()(**batch["net_input"])[0].log_softmax(-1)
        b = wide.eval()(**batch["net_input"])[0].log_softmax(-1)
    mask = batch["target"].ne(task.target_dictionary.pad())
    worst = float((a - b).abs()[mask].max())
    same = bool((a.argmax(-1) == b.argmax(-1))[mask].all())
    return worst, same


def save(obj, path):
    """Into path's folder (made if missing), by fairseq's atomic save (a temporary
    file renamed): an interrupted run leaves no half-written checkpoint."""
    from fairseq.checkpoint_utils import torch_persistent_save

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch_persistent_save(obj, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("narrow", help="a trained checkpoint (pre-norm, shared embeddings, sinusoidal positions)")
    ap.add_argument("out", help="the wide checkpoint to write")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--check-data", default=None,
                    help="a data-bin of the narrow model's vocabulary: compare the two models' log-probabilities")
    ap.add_argument("--drafter", default=None,
                    help="a --shared-encoder drafter of the narrow model, to read the wide one (--drafter-out)")
    ap.add_argument("--drafter-out", default=None, help="where the drafter for the wide model goes")
    args = ap.parse_args(argv)
    if bool(args.drafter) != bool(args.drafter_out):
        raise SystemExit("error: --drafter and --drafter-out go together")
    state = torch.load(args.narrow, map_location="cpu", weights_only=False)
    if state.get("args") is None and not isinstance((state.get("cfg") or {}).get("model"), argparse.Namespace):
        raise SystemExit("error: the checkpoint's model configuration is not an argparse namespace")
    wide = widen(state, args.dim, args.ffn, args.heads)
    save(wide, args.out)
    n = sum(t.numel() for k, t in wide["model"].items() if not k.endswith(".version"))
    print(f"{args.out}: d={args.dim}, ffn {args.ffn}, {args.heads} heads, {n:,} parameters")
    if args.drafter:
        drafter = torch.load(args.drafter, map_location="cpu", weights_only=False)
        save(drafter_for_wide(drafter, wide, model_args(state), args.dim, args.heads, args.out),
             args.drafter_out)
        print(f"{args.drafter_out}: the drafter of {args.drafter}, reading {args.out}")
    if args.check_data:
        worst, same = check(args.narrow, args.out, args.check_data)
        print(f"largest log-probability difference to the narrow model: {worst:.2e}; "
              f"same argmax everywhere: {same}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
