#!/usr/bin/env python
"""What limits exact GAD's acceptance for a block drafter and its verifier.

On sentences of the drafter's training data (self-distilled: the verifier's
own greedy outputs) it prints

* how sure the verifier is of its own greedy choices (mean and median top-1
  probability, teacher-forced): a drafter has to guess the argmax of that
  distribution, which is hard where it is flat;
* the drafter's accuracy per slot and its mean run of correct leading slots
  (what exact GAD accepts; no glancing, a random cut per sentence, the
  criterion's own counts), and, for a ``--verifier-features`` drafter, the same
  with the verifier's features zeroed (what the features add).

    python scripts/diagnostics/gad_limits.py --drafter work/ende-cpu/models/drafter/checkpoint_last.pt \\
        --verifier work/ende-cpu/models/teacher/checkpoint_best.pt [--sentences 600] [--json F]

``--json F`` writes the figures as a result (with its command, commit and
machine) that ``scripts/results.py add`` stores; the ``gad-limits`` table shows it.
"""
import argparse

import torch


def main(argv=None):
    from fairseq_aggressive.bench.provenance import output_file
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", required=True, help="block_nat checkpoint")
    p.add_argument("--verifier", required=True, help="the autoregressive verifier it drafts for")
    p.add_argument("--subset", default="train", help="split of the drafter's data (default: train)")
    p.add_argument("--sentences", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=output_file, default=None,
                   help="write the figures here (a result scripts/results.py stores)")
    a = p.parse_args(argv)

    from fairseq import checkpoint_utils, tasks

    import fairseq_aggressive  # noqa: F401 (registers the task, models, criterion)
    from fairseq_aggressive.criterions.glat_block_loss import make_blocks, slot_counts
    from fairseq_aggressive.drafters.nar_block_checkpoint import load_block_drafter
    from fairseq_aggressive.models.block_nat import load_verifier

    state = checkpoint_utils.load_checkpoint_to_cpu(a.drafter)
    task = tasks.setup_task(state["cfg"]["task"])
    task.load_dataset(a.subset)
    drafter, k = load_block_drafter(task, a.drafter)
    k = k or 8
    verifier = load_verifier(a.verifier, task)
    features = bool(getattr(drafter, "reads_verifier_features", False))
    ds = task.dataset(a.subset)
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randperm(len(ds), generator=g)[: a.sentences].tolist()
    pad = task.target_dictionary.pad()
    variants = ["features", "features zeroed"] if features else ["drafter"]
    totals = {v: {} for v in variants}
    top1 = []
    for b in range(0, len(ids), 50):
        sample = ds.collater([ds[i] for i in ids[b : b + 50]])
        net, target = sample["net_input"], sample["target"]
        with torch.no_grad():
            enc = verifier.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            feats, _ = verifier.decoder(net["prev_output_tokens"], encoder_out=enc, features_only=True)
            keep = target.ne(pad)
            top1.append(verifier.decoder.output_layer(feats).softmax(-1).max(-1).values[keep])
            lengths = keep.sum(1)
            u = torch.rand(lengths.shape, generator=g)
            cut = torch.minimum((u * lengths.float()).floor().long(), lengths - 1).clamp(min=0)
            tokens, slots, block_target = make_blocks(net["prev_output_tokens"], target, pad, k, cut)
            d_enc = drafter.encode(net["src_tokens"], net["src_lengths"])
            shifted = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)
            cols = torch.arange(tokens.size(1)).clamp(max=shifted.size(1) - 1)
            for v in variants:
                pf = None if v == "drafter" else shifted[:, cols] * (v == "features")
                pred = drafter.block_logits(tokens, slots, d_enc, prefix_feats=pf).argmax(-1)
                hit = torch.zeros_like(slots)
                hit[slots] = pred.eq(block_target[slots])
                for key, n in slot_counts(hit, block_target.ne(pad), cut, k, leading=True).items():
                    totals[v][key] = totals[v].get(key, 0) + n
    t = torch.cat(top1)
    print(f"{len(ids)} sentences of {a.subset}, {t.numel()} target tokens, block size {k}")
    print(f"verifier's top-1 probability on its own greedy choices: mean {t.mean():.3f}, median {t.median():.3f}, "
          f"above 0.9: {100 * (t > 0.9).float().mean():.1f}%")
    slots = {}
    for v, c in totals.items():
        acc = [c[f"n_correct{i}"] / max(c[f"n_slot{i}"], 1) for i in range(1, min(k, 8) + 1)]
        slots[v] = {"accuracy": acc, "leading": c["n_leading"] / c["n_rows"]}
        print(f"{v}: slot accuracy {' '.join(f'{x:.3f}' for x in acc)}; mean run of correct leading slots "
              f"{slots[v]['leading']:.2f}")
    if a.json:
        from fairseq_aggressive.bench.provenance import write_result

        write_result(a.json, {"kind": "gad_limits", "subset": a.subset, "sentences": len(ids), "tokens": t.numel(),
                              "block_size": k, "top1": {"mean": float(t.mean()), "median": float(t.median()),
                                                        "above_0.9": float((t > 0.9).float().mean())},
                              "slots": slots}, "scripts/diagnostics/gad_limits.py")

if __name__ == "__main__":
    main()
