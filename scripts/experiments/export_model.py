#!/usr/bin/env python
"""Package a trained fairseq checkpoint for shipping: weights stored in float16
(loaded back into float32 by fairseq), no optimizer state, with the dictionaries
and BPE codes it needs, and a MODEL.json that says how it was made.

    python scripts/experiments/export_model.py CKPT.pt --data DATA/bin --bpe-codes DATA/bpe.codes \
        --out models/uagec-9x3 [--note "how it was trained"]

The exported ``model.pt`` decodes with stock tools exactly like the original
weights rounded to float16 (greedy and IAD are compared on the rounded model).
"""
import argparse
import json
import os
import shutil
import sys

import torch


def export(ckpt, data, bpe_codes, out, note=""):
    if not os.path.isfile(ckpt):
        raise SystemExit(f"error: no checkpoint at {ckpt}")
    dicts = sorted(f for f in os.listdir(data) if f.startswith("dict.") and f.endswith(".txt"))
    if not dicts:
        raise SystemExit(f"error: no dict.*.txt in {data}")
    if bpe_codes and not os.path.isfile(bpe_codes):
        raise SystemExit(f"error: no BPE codes at {bpe_codes}")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state.pop("last_optimizer_state", None)
    state["model"] = _to_half(state["model"])
    hist = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    try:
        meta = _describe(state, hist, extra, note)
    except (AttributeError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {ckpt} has no usable fairseq config ({e!r})")
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save(state, os.path.join(tmp, "model.pt"))
    for f in dicts:
        shutil.copy(os.path.join(data, f), tmp)
    if bpe_codes:
        shutil.copy(bpe_codes, os.path.join(tmp, "bpe.codes"))
    with open(os.path.join(tmp, "MODEL.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, default=str)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return meta


def _to_half(weights):
    """float16 copies of the floating-point tensors; tensors that shared storage
    (tied embeddings and output projection) still share it, so they are stored once."""
    out, seen = {}, {}
    for k, v in weights.items():
        if not v.is_floating_point():
            out[k] = v
            continue
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key not in seen:
            seen[key] = v.half()
        out[k] = seen[key]
    return out


def _get(section, key):
    """A field of a config section stored as an argparse Namespace, a dict or a DictConfig."""
    return section[key] if isinstance(section, dict) else getattr(section, key)


def _describe(state, hist, extra, note):
    model, task = state["cfg"]["model"], state["cfg"]["task"]
    arch = getattr(model, "arch", None) if not isinstance(model, dict) else model.get("arch")
    return {
        "arch": arch or _get(model, "_name"),
        "encoder_layers": _get(model, "encoder_layers"),
        "decoder_layers": _get(model, "decoder_layers"),
        "embed_dim": _get(model, "encoder_embed_dim"),
        "ffn_dim": _get(model, "encoder_ffn_embed_dim"),
        "source_lang": _get(task, "source_lang"),
        "target_lang": _get(task, "target_lang"),
        "updates": hist[-1].get("num_updates"),
        "best_valid_loss": (extra.get("best") if extra.get("best") is not None
                            else hist[-1].get("best_loss")),
        "parameters": sum(v.numel() for v in {id(v): v for v in state["model"].values()}.values()),
        "storage": "float16 (loaded as float32)",
        "note": note,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--data", required=True, help="binarized data dir with the dict.*.txt files")
    ap.add_argument("--bpe-codes", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    meta = export(a.checkpoint, a.data, a.bpe_codes, a.out, a.note)
    size = os.path.getsize(os.path.join(a.out, "model.pt")) / 2**20
    print(f"{a.out}: {meta['parameters']:,} parameters, {size:.1f} MiB, {meta['updates']} updates")


if __name__ == "__main__":
    sys.exit(main())
