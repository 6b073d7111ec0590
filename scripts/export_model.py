#!/usr/bin/env python
"""Package a trained fairseq checkpoint for shipping: weights stored in float16
(loaded back into float32 by fairseq), no optimizer state, with the dictionaries
and BPE codes it needs, and a MODEL.json that says how it was made.

    python scripts/export_model.py CKPT.pt --data DATA/bin --bpe-codes DATA/bpe.codes \
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
    state["model"] = {k: v.half() if v.is_floating_point() else v for k, v in state["model"].items()}
    hist = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save(state, os.path.join(tmp, "model.pt"))
    for f in dicts:
        shutil.copy(os.path.join(data, f), tmp)
    if bpe_codes:
        shutil.copy(bpe_codes, os.path.join(tmp, "bpe.codes"))
    cfg = state["cfg"]
    meta = {
        "arch": cfg["model"].arch if hasattr(cfg["model"], "arch") else cfg["model"]._name,
        "encoder_layers": cfg["model"].encoder_layers,
        "decoder_layers": cfg["model"].decoder_layers,
        "embed_dim": cfg["model"].encoder_embed_dim,
        "ffn_dim": cfg["model"].encoder_ffn_embed_dim,
        "source_lang": cfg["task"].source_lang,
        "target_lang": cfg["task"].target_lang,
        "updates": hist[-1].get("num_updates"),
        "best_valid_loss": (extra.get("best") if extra.get("best") is not None
                            else hist[-1].get("best_loss")),
        "parameters": sum(v.numel() for v in state["model"].values()),
        "storage": "float16 (loaded as float32)",
        "note": note,
    }
    with open(os.path.join(tmp, "MODEL.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, default=str)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return meta


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
