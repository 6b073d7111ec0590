#!/usr/bin/env python
"""Where two benchmark modes disagree, how close was the choice?  For every
sentence whose outputs differ between mode A and mode B in a
``fairseq-aggressive-bench --bench-json`` file, the top-2 log-prob gap of the
checkpoint's model (fairseq's full forward pass over A's prefix) at the first
differing token.  A small gap means a near-tie that rounding may flip.

    python scripts/diagnostics/near_ties.py BENCH.json --path CKPT --data DATA-BIN \
        --modes greedy-int8,iad-int8 [--int8]

``--int8`` measures the gaps on the model with int8 linear layers
(``--inference-precision int8``).
"""
import argparse
import json
import statistics
import sys

import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json")
    p.add_argument("--path", required=True, help="the checkpoint the bench decoded with")
    p.add_argument("--data", required=True, help="the binarized data directory the bench read")
    p.add_argument("--modes", required=True, help="A,B: two modes of the bench JSON")
    p.add_argument("--int8", action="store_true", help="gaps of the int8 model")
    p.add_argument("--gen-subset", default="test")
    args = p.parse_args(argv)

    import fairseq_aggressive  # noqa: F401  (registers the task)
    from fairseq import checkpoint_utils

    from fairseq_aggressive.runtime.quantization import quantize_int8

    a, _, b = args.modes.partition(",")
    res = json.load(open(args.bench_json))
    recs = res["per_sentence"]
    missing = [m for m in (a, b) if not m or any(m not in r for r in recs)]
    if missing:
        raise SystemExit(f"error: mode(s) {missing} not in {args.bench_json}; it has {sorted(res['modes'])}")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data})
    model = models[0].eval()
    if args.int8:
        quantize_int8(model)
    d = task.target_dictionary
    task.load_dataset(args.gen_subset)
    ds = task.dataset(args.gen_subset)
    gaps = []
    for r in recs:
        x, y = r[a]["tokens"], r[b]["tokens"]
        if x == y:
            continue
        k = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        src = ds[r["id"]]["source"].unsqueeze(0)
        prev = torch.tensor([[d.eos()] + x[:k]])
        with torch.no_grad():
            out = model(src, torch.tensor([src.size(1)]), prev)
            lp = model.get_normalized_probs(out, log_probs=True)[0, -1]
        top = lp.topk(2).values
        gaps.append(float(top[0] - top[1]))
    print(f"{len(recs)} sentences, {len(gaps)} differ between {a} and {b}")
    if gaps:
        gaps.sort()
        print(f"top-2 gap at the first difference: min {gaps[0]:.4f}, median {statistics.median(gaps):.4f}, "
              f"max {gaps[-1]:.4f}")
        print("all: " + " ".join(f"{g:.4f}" for g in gaps))


if __name__ == "__main__":
    sys.exit(main())
