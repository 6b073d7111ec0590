"""IAD's draft lengths side by side: the engine's greedy, IAD with fixed drafts
(``--draft-cost off``) and IAD under the engine's draft-length policy (the
default), taking turns on every batch (in rotating order), at several batch
sizes; medians of the rounds and ratios to greedy, every output checked
against greedy's.

    python scripts/diagnostics/draft_lengths_side_by_side.py models/uagec-9x3 \\
        data/uagec-sample/test.tok.src --batch-sizes 1,8,32 --rounds 5 [--checkpoint PATH] [--int8] [--load 2]
"""
import argparse
import statistics
import time

MODES = {"greedy": dict(max_draft_len=0), "iad-fixed": dict(draft_cost="off"), "iad": {}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("sentences")
    p.add_argument("--checkpoint", default=None, help="another checkpoint with the model directory's dictionaries")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-sentences", type=int, default=300)
    p.add_argument("--int8", action="store_true", help="the model's int8 copy (--inference-precision int8)")
    p.add_argument("--threads", type=int, default=None, help="the engine's threads (default: all CPUs)")
    p.add_argument("--load", type=int, default=0, help="beside N CPU-bound processes")
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.max_sentences < 1:
        raise SystemExit("--rounds and --max-sentences must be >= 1")
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if any(b < 1 for b in sizes):
        raise SystemExit("--batch-sizes must be >= 1")

    import torch

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.diagnostics.loading import token_batches
    from fairseq_aggressive.native.machine import describe_machine
    from fairseq_aggressive.translator import Translator, load_hub

    hub = load_hub(args.model_dir, checkpoint_file=args.checkpoint or "model.pt")
    base = dict(decoding="iad", max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    if args.int8:
        base["inference_precision"] = "int8"
    if args.threads:
        base["native_threads"] = args.threads
    gens = {m: Translator(hub, **base, **kw) for m, kw in MODES.items()}
    with open(args.sentences, encoding="utf-8") as f:
        lines = [line.strip() for line, _ in zip(f, range(args.max_sentences))]
    tokens = [hub.encode(s) for s in lines]
    d = hub.src_dict
    print(f"machine: {describe_machine()}")
    print(f"{len(lines)} sentences, {args.rounds} alternating rounds, {'int8' if args.int8 else 'float32'}, "
          f"engine threads {gens['iad'].generator.native.threads}, load {args.load}")
    print("| batch | greedy ms/sent | iad-fixed ms/sent | iad ms/sent | iad-fixed x greedy | iad x greedy | "
          "iad tok/pass |")
    print("|---|---|---|---|---|---|---|")
    with cpu_load(args.load):
        for bsz in sizes:
            samples = token_batches(tokens, d, bsz)
            times = {m: [] for m in MODES}
            order = list(MODES)
            for r in range(args.rounds + 1):  # the first round warms up (and measures the pass cost)
                spent = {m: 0.0 for m in MODES}
                outs = {m: [] for m in MODES}
                for t in gens.values():
                    t.generator.stats.__init__()
                # the modes take turns on every batch, each batch in another order: a machine
                # whose speed drifts (other guests, clocks) moves every mode's time alike
                for i, s in enumerate(samples):
                    for m in order[i % len(order):] + order[:i % len(order)]:
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            hyps = hub.task.inference_step(gens[m].generator, hub.models, s)
                        spent[m] += time.perf_counter() - t0
                        outs[m].extend(h[0]["tokens"].tolist() for h in hyps)
                if r:
                    for m in MODES:
                        times[m].append(spent[m])
            bad = [m for m in MODES if outs[m] != outs["greedy"]]
            if bad:
                raise SystemExit(f"batch {bsz}: {', '.join(bad)} differ from greedy")
            ms = {m: 1000 * statistics.median(v) / len(lines) for m, v in times.items()}
            st = gens["iad"].generator.stats
            tpp = st.tokens / st.sentence_passes if st.sentence_passes else float("nan")
            print(f"| {bsz} | {ms['greedy']:.3f} | {ms['iad-fixed']:.3f} | {ms['iad']:.3f} | "
                  f"{ms['greedy'] / ms['iad-fixed']:.2f} | {ms['greedy'] / ms['iad']:.2f} | {tpp:.2f} |")


if __name__ == "__main__":
    main()
