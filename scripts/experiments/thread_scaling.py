#!/usr/bin/env python
"""Does a second engine thread pay, by model size, quiet and under load?

    python scripts/experiments/thread_scaling.py [--load 2] [--sentences 30] [--threads 1,2]

Random-weight fairseq Transformers of several widths (6 encoder layers, an
8,424-token vocabulary, as the UA-GEC models) decode the same random
sentences greedily on the native engine with each thread count, interleaved
sentence by sentence; prints milliseconds per decoder step (encoding
included) and the speedup of each count over the first.  ``--load N`` runs N
CPU-bound processes beside it (fairseq-aggressive-bench's --bench-load).
Timing does not depend on the weights; outputs are checked to be identical
across thread counts.
"""
import argparse
import random
import time

import torch


def random_model(dim: int, dec_layers: int, vocab: int):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from fairseq_aggressive.tasks.aggressive_translation import (AggressiveTranslationConfig,
                                                                 AggressiveTranslationTask)

    d = Dictionary()
    for i in range(vocab - d.nspecial):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    task = AggressiveTranslationTask(AggressiveTranslationConfig(), d, d)
    args = argparse.Namespace(encoder_embed_dim=dim, decoder_embed_dim=dim, encoder_ffn_embed_dim=4 * dim,
                              decoder_ffn_embed_dim=4 * dim, encoder_attention_heads=max(2, dim // 64),
                              decoder_attention_heads=max(2, dim // 64), encoder_layers=6,
                              decoder_layers=dec_layers, dropout=0.0, max_source_positions=256,
                              max_target_positions=256)
    ARCH_CONFIG_REGISTRY["transformer"](args)
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY["transformer"].build_model(args, task).eval(), d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the decoder")
    ap.add_argument("--sentences", type=int, default=30)
    ap.add_argument("--threads", default="1,2", help="engine thread counts to compare")
    ap.add_argument("--sizes", default="64x3,128x3,256x3,256x6,512x6", help="WIDTHxDECODER_LAYERS, ...")
    ap.add_argument("--max-len", type=int, default=40)
    args = ap.parse_args(argv)

    import fairseq_aggressive  # noqa: F401
    from fairseq_aggressive.native.machine import describe_machine
    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.native import NativeEngine

    counts = [int(t) for t in args.threads.split(",")]
    print(f"machine: {describe_machine()}; load: {args.load} CPU-bound processes; {args.sentences} sentences, "
          f"greedy up to {args.max_len} steps")
    print("| model | " + " | ".join(f"ms/step, {t} thread{'s' if t > 1 else ''}" for t in counts)
          + " | " + " | ".join(f"x {t} vs {counts[0]}" for t in counts[1:]) + " |")
    print("|" + "---|" * (1 + 2 * len(counts) - 1))
    rng = random.Random(1)
    for size in args.sizes.split(","):
        dim, layers = (int(x) for x in size.split("x"))
        model, d = random_model(dim, layers, 8424)
        rows = [[rng.randint(d.nspecial, len(d) - 1) for _ in range(rng.randint(15, 30))] + [d.eos()]
                for _ in range(args.sentences)]
        engines = {t: NativeEngine(model, d, threads=t) for t in counts}
        total = {t: 0.0 for t in counts}
        outs = {t: [] for t in counts}
        steps = 0
        with cpu_load(args.load):
            for i, row in enumerate(rows):
                src = torch.tensor([row])
                for t in (counts if i % 2 == 0 else counts[::-1]):
                    t0 = time.perf_counter()
                    state = engines[t].begin(src, args.max_len)
                    out = [d.eos()]
                    for _ in range(args.max_len):
                        emit, _, _, done, _ = state.step([0], [[out[-1]]], args.max_len, 1, 0.0, 1.0)
                        out += emit[0]
                        if done[0]:
                            break
                    total[t] += time.perf_counter() - t0
                    outs[t].append(out)
                steps += len(outs[counts[0]][-1]) - 1
        if any(outs[t] != outs[counts[0]] for t in counts):
            raise SystemExit(f"error: outputs differ between thread counts at d={dim}")
        ms = {t: 1000 * total[t] / steps for t in counts}
        print(f"| d={dim}, 6+{layers} | " + " | ".join(f"{ms[t]:.3f}" for t in counts) + " | "
              + " | ".join(f"{ms[counts[0]] / ms[t]:.2f}" for t in counts[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
