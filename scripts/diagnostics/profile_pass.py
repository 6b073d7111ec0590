#!/usr/bin/env python
"""Where the time of one IAD pass of the torch verifier goes (batch 1; the
native engine, ``--engine native``, runs a whole pass in one compiled call).

    python scripts/diagnostics/profile_pass.py DATA --path CKPT [--sentences 100] [--threads 2] [--json F]

Prints, with the machine:

1. IAD over the first N test sentences split into its parts: encoder (plus the
   encoder-attention keys/values and cache allocation), verifier forward (decoder
   layers), scoring (vocabulary projection, adjustments, acceptance), drafter,
   and the rest (the generator's Python: building token tensors, ``.tolist()``,
   bookkeeping); per sentence and per pass.
2. The cost of one verifier pass against the number of positions it scores
   (1 = one greedy step) on a real sentence state: forward + scoring, median
   of many repetitions.
3. The torch operators that take the most time over a few sentences
   (``torch.profiler``).

``--json F`` writes the three as a result (with its command, commit and
machine) that ``scripts/results.py add`` stores; the ``torch-pass`` table
shows it.

Compare the ms per pass with CTranslate2's ms per step from
``fairseq-aggressive-bench --bench-modes greedy,iad,ct2`` on the same checkpoint.
"""
import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch

from fairseq_aggressive.diagnostics.loading import load_model_and_samples


def timed(obj, name, bucket, key):
    """Wrap ``obj.name`` so that its wall time is added to ``bucket[key]``."""
    fn = getattr(obj, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        bucket[key] += time.perf_counter() - t0
        return out

    setattr(obj, name, wrapper)


def main(argv=None):
    from fairseq_aggressive.bench.provenance import output_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--path", required=True)
    ap.add_argument("--subset", default="test")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-len-a", type=float, default=1.2)
    ap.add_argument("--max-len-b", type=int, default=10)
    ap.add_argument("--reps", type=int, default=200, help="repetitions per width in part 2")
    ap.add_argument("--json", type=output_file, default=None,
                    help="write the figures here (a result scripts/results.py stores)")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    model, task, samples = load_model_and_samples(a.data, a.path, a.subset, a.sentences)
    from fairseq_aggressive.native.machine import describe_machine
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator

    d = task.target_dictionary
    n = len(samples)
    dec = model.decoder
    print(f"machine: {describe_machine()}")
    print(f"model: {a.path} ({len(model.encoder.layers)}+{len(dec.layers)} layers, "
          f"d={dec.embed_dim}, vocabulary {len(d)}); {n} sentences, batch 1, {a.threads} threads")

    def new_gen():
        return build_generator([model], d, InputCopyDrafter(d, d), max_len_a=a.max_len_a,
                                   max_len_b=a.max_len_b, engine="torch")

    # ---- 1. IAD split into parts
    gen = new_gen()
    for s in samples[:5]:  # warm-up
        gen.generate([model], s)
    gen = new_gen()
    parts = defaultdict(float)
    v = gen.verifier.decoder  # the torch verifier's cached decoder
    timed(v, "encode", parts, "encoder")
    timed(v, "begin", parts, "encoder")
    timed(v, "forward", parts, "verifier forward")
    timed(gen.verifier, "_choose", parts, "scoring + acceptance")
    total = 0.0
    for s in samples:
        t0 = time.perf_counter()
        gen.generate([model], s)
        total += time.perf_counter() - t0
    st = gen.stats.as_dict()
    parts["drafter"] = st["draft_seconds"]
    parts["rest (generator Python)"] = total - sum(parts.values())
    passes = st["sentence_passes"]
    print(f"\n1. IAD: {1000 * total / n:.2f} ms per sentence, {st['mean_passes_per_sentence']:.2f} passes "
          f"per sentence, {st['mean_tokens_per_pass']:.2f} tokens per pass, "
          f"{1000 * total / passes:.3f} ms per pass (encoder included)")
    print("| part | ms per sentence | ms per pass | share |\n|---|---|---|---|")
    for k, sec in parts.items():
        print(f"| {k} | {1000 * sec / n:.3f} | {1000 * sec / passes:.3f} | {100 * sec / total:.0f}% |")
    res = {"kind": "torch_pass", "threads": a.threads, "sentences": n, "passes_per_sentence": passes / n,
           "tokens_per_pass": st["mean_tokens_per_pass"], "ms_per_sentence": 1000 * total / n,
           "parts_ms_per_sentence": {k: 1000 * sec / n for k, sec in parts.items()}, "passes": {}}

    # ---- 2. one pass against the number of positions
    s = max(samples, key=lambda x: x["net_input"]["src_tokens"].size(1))
    gen = new_gen()
    src = s["net_input"]["src_tokens"][0].tolist()
    widths = [w for w in (1, 2, 4, 8, 16, 32) if w <= len(src)]
    print(f"\n2. one verifier pass (forward + scoring) on a {len(src)}-token source, 8 positions cached")
    print("| positions | ms per pass | ms per position |\n|---|---|---|")
    with torch.no_grad():
        enc = v.encode(s["net_input"])
        gen.verifier.max_len = 200
        for w in widths:
            times = []
            for _ in range(a.reps):
                state = v.begin(enc, 128)
                state.lengths += 8
                tokens = torch.tensor([src[:w]])
                n_draft = torch.tensor([w - 1])
                t0 = time.perf_counter()
                feats = v.forward(state, tokens, n_draft + 1)
                positions = state.lengths.unsqueeze(1) + torch.arange(w)
                gen.verifier._choose(feats, tokens, n_draft, positions)
                times.append(time.perf_counter() - t0)
            med = 1000 * statistics.median(times)
            print(f"| {w} | {med:.3f} | {med / w:.3f} |")
            res["passes"][str(w)] = {"n": len(times), "median_ms": med, "mean_ms": 1000 * statistics.mean(times)}

    # ---- 3. top operators
    from torch.profiler import ProfilerActivity, profile

    gen = new_gen()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for s in samples[:20]:
            gen.generate([model], s)
    print("\n3. top operators over 20 sentences (self CPU time)")
    ops = prof.key_averages()
    print(ops.table(sort_by="self_cpu_time_total", row_limit=15))
    if a.json:
        top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
        res["profiled"] = {"sentences": len(samples[:20]), "passes": gen.stats.as_dict()["sentence_passes"],
                           "aten_calls": sum(e.count for e in ops if e.key.startswith("aten::")),
                           "top_ops": [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000}
                                       for e in top]}
        from fairseq_aggressive.bench.provenance import write_result

        write_result(a.json, res, "scripts/diagnostics/profile_pass.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
