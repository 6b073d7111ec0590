#!/usr/bin/env python
"""Average the parameters of a training run's last N checkpoints (as the GAD
paper does, after Vaswani et al. 2017 and Ott et al. 2018) into one checkpoint.

    python scripts/experiments/average_checkpoints.py SAVE_DIR --last 10 --output SAVE_DIR/checkpoint_avg10.pt

The checkpoints are fairseq-train's interval checkpoints ``checkpoint_E_U.pt``
(``--save-interval-updates``, kept with ``--keep-interval-updates N`` or more),
the N of the highest update counts U.  Each parameter is averaged in float64
and stored in its own type; everything else (arguments, the last optimizer
history) is the newest checkpoint's.  Written by fairseq's atomic save.
"""
import argparse
import re
import sys
from pathlib import Path


def interval_checkpoints(save_dir: Path):
    """``checkpoint_E_U.pt`` files of ``save_dir``, oldest update first."""
    found = []
    for path in save_dir.glob("checkpoint_*_*.pt"):
        m = re.fullmatch(r"checkpoint_(\d+)_(\d+)\.pt", path.name)
        if m:
            found.append((int(m.group(2)), path))
    return [p for _, p in sorted(found)]


def average(paths):
    """The newest checkpoint's state with the mean of every model tensor of ``paths``."""
    import torch
    from fairseq import checkpoint_utils

    total, state, keys = None, None, None
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
        model = state["model"]
        if keys is None:
            keys = list(model)
            total = {k: model[k].double().clone() if model[k].is_floating_point() else model[k] for k in keys}
        elif list(model) != keys:
            raise SystemExit(f"error: {path} holds other parameters than {paths[0]}")
        else:
            for k in keys:
                if model[k].is_floating_point():
                    total[k] += model[k].double()
    dtypes = {k: v.dtype for k, v in state["model"].items()}
    state["model"] = {k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else state["model"][k]
                      for k, v in total.items()}
    return state


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("save_dir", type=Path)
    p.add_argument("--last", type=int, default=10, help="how many of the newest interval checkpoints (default 10)")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    if args.last < 1:
        raise SystemExit("error: --last must be >= 1")
    paths = interval_checkpoints(args.save_dir)
    if len(paths) < args.last:
        raise SystemExit(f"error: {args.save_dir} holds {len(paths)} interval checkpoints (checkpoint_E_U.pt), "
                         f"{args.last} are needed: train with --save-interval-updates and --keep-interval-updates "
                         f">= {args.last}")
    from fairseq import checkpoint_utils

    chosen = paths[-args.last:]
    state = average(chosen)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, str(args.output))
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
