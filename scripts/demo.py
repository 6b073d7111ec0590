#!/usr/bin/env python
"""The newcomer's demo: IAD against beam 5 and greedy on Ukrainian GEC.

    python scripts/demo.py            # make demo: the shipped UA-GEC 9+3 model (models/uagec-9x3)
    python scripts/demo.py --train    # make demo-train: first train a small 9+3 model on the
                                      # bundled sample (update budget, float32), then the same

Both decode the 300 test sentences of the bundled UA-GEC sample (data/uagec-sample; the sample's
test split is part of UA-GEC's test partition, which the shipped model never saw) with
``fairseq-generate --decoding iad``, then beam 5, greedy and IAD side by side at batch 1 with
``fairseq-aggressive-bench``, and check that

* the model is usable: IAD accepts at least MIN_TOKENS_PER_PASS tokens per pass (a GEC model
  copies most of its input; a broken one accepts ~1) and, when trained here, its validation loss
  is below MAX_VALID_LOSS; otherwise it says so and stops instead of benchmarking garbage;
* IAD's output is identical to greedy's on every sentence; on the native engine, IAD on the
  model's int8 copy is identical to that copy's greedy too (beside CTranslate2's int8).

Results are the same on every CPU (training is float32 with an update budget, decoding float32);
the speed numbers are printed with the machine they were measured on.
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fairseq_aggressive.data_prep import common as prep_common

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = ROOT / "data" / "uagec-sample"
SHIPPED = ROOT / "models" / "uagec-9x3"
USER_DIR = str(ROOT / "fairseq_aggressive")
# the model trained here accepts about 2.1 tokens per pass (uncapped drafts, batch 32), the shipped
# one 2.9; a model that does not copy accepts about 1: the bar sits between, clear of training noise
MIN_TOKENS_PER_PASS = 1.5
MAX_VALID_LOSS = 5.0  # label-smoothed loss (base 2) on the sample's valid split
TRAIN_UPDATES = 1200
LEN = ["--max-len-a", "1.2", "--max-len-b", "10"]  # GEC output ~ source length

# the demo-train model: 9+3 deep/shallow, d=64, float32, an update budget (the same model on
# every machine)
TRAIN_ARGS = [
    "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
    "--arch", "transformer_deep_shallow", "--encoder-layers", "9", "--decoder-layers", "3",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings",
    "--dropout", "0", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "3e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "3000", "--max-update", str(TRAIN_UPDATES), "--max-epoch", "1000",
    "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "simple",
    "--log-interval", "100", "--seed", "1",
]


tool = prep_common.console_script  # a console script of this environment (the venv's first)


def sh(cmd, **kw):
    proc = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if proc.returncode:
        sys.exit(f"error: {' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n"
                 + "\n".join((proc.stdout + proc.stderr).splitlines()[-20:]))
    return proc


def shipped_data(work: Path):
    """The sample's test split in the shipped model's BPE and vocabulary."""
    for f in ("model.pt", "bpe.codes", "dict.src.txt", "MODEL.json"):
        if not (SHIPPED / f).is_file():
            sys.exit(f"error: the shipped model is incomplete: {SHIPPED / f} is missing")
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        lines = prep_common.read_lines(SAMPLE / f"test.tok.{side}")
        prep_common.write_lines(out / f"test.{side}", prep_common.apply_bpe(SHIPPED / "bpe.codes", lines))
    binned = prep_common.binarize(out, "src", "tgt", workers=1, splits=("test",),
                                  dictionary=SHIPPED / "dict.src.txt")
    meta = json.loads((SHIPPED / "MODEL.json").read_text())
    print(f"model: {SHIPPED.relative_to(ROOT)} ({meta['encoder_layers']}+{meta['decoder_layers']} layers, "
          f"d={meta['embed_dim']}, {meta['parameters']:,} parameters, {meta['updates']} updates on "
          f"the full UA-GEC train set)")
    return binned, SHIPPED / "model.pt", SHIPPED / "bpe.codes"


def trained_data(work: Path):
    """Prepare the bundled sample and train the small model (skipped if its checkpoint exists)."""
    data = work / "data"
    if not (data / "bin" / "dict.src.txt").is_file():
        sh([sys.executable, str(ROOT / "scripts" / "data" / "prepare_uagec.py"), "--from-text", str(SAMPLE),
            "--out", str(data), "--bpe-ops", "2000", "--workers", "1"])
    ckpt = work / "ckpt" / "checkpoint_last.pt"
    # fairseq-train resumes from checkpoint_last.pt (an interrupted run continues; a finished
    # one stops at once)
    print(f"training a 9+3 model (d=64) for {TRAIN_UPDATES} updates, float32 ...", flush=True)
    proc = sh([tool("fairseq-train"), str(data / "bin"), "--user-dir", USER_DIR, *TRAIN_ARGS,
               "--save-dir", str(ckpt.parent)])
    for line in (proc.stdout + proc.stderr).splitlines():
        if "valid on" in line or "done training" in line or "loaded checkpoint" in line:
            print("  " + re.sub(r"^.*? \| INFO \| [\w.]+ \| ", "", line))
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    loss = state["extra_state"].get("best")
    updates = state["optimizer_history"][-1].get("num_updates")
    print(f"model: {ckpt} ({updates} updates, best valid loss {loss:.3f})")
    if loss is None or loss > MAX_VALID_LOSS:
        sys.exit(f"the model is not usable: valid loss {loss} > {MAX_VALID_LOSS} after {updates} "
                 "updates; training did not learn (not benchmarking it)")
    return data / "bin", ckpt, data / "bpe.codes"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", action="store_true", help="train on the bundled sample first")
    ap.add_argument("--work", default=os.environ.get("WORK", str(ROOT / "work")))
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of every engine (default: each engine's own default, the CPUs this process may use)")
    ap.add_argument("--load", type=int, default=0,
                    help="decode beside N CPU-bound processes (fairseq-aggressive-bench --bench-load N)")
    ap.add_argument("--sentences", type=int, default=None,
                    help="benchmark only the first N test sentences (default all 300)")
    args = ap.parse_args(argv)
    work = Path(args.work) / ("demo-train" if args.train else "demo")
    work.mkdir(parents=True, exist_ok=True)
    from fairseq_aggressive.native.machine import describe_machine

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {describe_machine()}")
    print("== 1/3 model and data")
    data, ckpt, _ = trained_data(work) if args.train else shipped_data(work)

    print("== 2/3 fairseq-generate --decoding iad --max-draft-len 1024 --draft-cost off --batch-size 32 (first hypotheses)")
    proc = sh([tool("fairseq-generate"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
               "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
               "--gen-subset", "test", "--beam", "1", "--decoding", "iad", "--batch-size", "32",
               "--max-draft-len", "1024", "--draft-cost", "off",  # drafts as made, uncapped: how much the model copies
               "--remove-bpe", *LEN])
    (work / "generate.out").write_text(proc.stdout)
    for line in [l for l in proc.stdout.splitlines() if l[:2] in ("S-", "H-")][:6]:
        print("  " + line)
    m = re.search(r"aggressive decoding \(iad\): .*?([\d.]+) tokens accepted per pass", proc.stderr)
    if not m:
        sys.exit("error: fairseq-generate printed no aggressive decoding summary:\n" + proc.stderr[-2000:])
    print("  " + m.group(0))
    tpp = float(m.group(1))
    if tpp < MIN_TOKENS_PER_PASS:
        sys.exit(f"the model is not usable: IAD accepted {tpp:.2f} tokens per pass (a GEC model that "
                 f"copies its input accepts >= {MIN_TOKENS_PER_PASS}); not benchmarking it")

    import importlib.util

    has_ct2 = importlib.util.find_spec("ctranslate2") is not None  # make setup installs it
    from fairseq_aggressive.native import available

    # the int8 model on the engine (int8 weights, dynamically quantized activations): its IAD
    # against its own greedy, bit for bit, and against CTranslate2's int8
    int8 = available() is None
    print(f"== 3/3 beam 5 vs greedy vs IAD{' (float32 and int8)' if int8 else ''}{' vs CTranslate2 greedy (float32, and its fastest configuration)' if has_ct2 else ''}, batch 1"
          + (f", {args.threads} threads" if args.threads else "")
          + (f", beside {args.load} CPU-bound processes" if args.load else "") + " (fairseq-aggressive-bench)")
    js = work / "bench.json"
    proc = sh([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
               "--source-lang", "src", "--target-lang", "tgt", "--gen-subset", "test", "--remove-bpe",
               "--batch-size", "1", *(["--threads", str(args.threads)] if args.threads else []),
               "--bench-load", str(args.load), *LEN,
               *(["--bench-max-sentences", str(args.sentences)] if args.sentences else []),
               "--bench-modes", "beam5,greedy,iad" + (",greedy-native-int8,iad-int8" if int8 else "")
               + (",ct2,ct2-best" if has_ct2 else ""),
               "--bench-json", str(js), "--bench-plot", str(work / "bench.png")])
    print(proc.stdout.rstrip())
    res = json.loads(js.read_text())
    n, r = res["sentences"], res["modes"]
    same = r["iad"]["identical_to_greedy"]
    print(f"IAD output identical to greedy: {same}/{n} sentences")
    print(f"IAD: {r['iad']['mean_passes_per_sentence']:.2f} passes per sentence (greedy "
          f"{r['greedy']['mean_passes_per_sentence']:.2f}), {r['iad']['mean_tokens_per_pass']:.2f} tokens per pass")
    print(f"speedup over beam 5: greedy {r['greedy']['speedup_vs_beam5']:.2f}x, IAD "
          f"{r['iad']['speedup_vs_beam5']:.2f}x; IAD over greedy {r['iad']['speedup_vs_greedy']:.2f}x")
    if has_ct2:
        from fairseq_aggressive.bench.report import describe_mode

        fastest = res["ct2_fastest"]  # the fastest CTranslate2 greedy over the run, the ratios' base
        print(f"CTranslate2 greedy on the same checkpoint: {describe_mode('ct2', r['ct2'])} "
              f"{r['ct2']['mean_ms_per_sentence']:.1f} ms per sentence; the configuration its probe found fastest "
              f"on this machine, {describe_mode('ct2-best', r['ct2-best'])}, {r['ct2-best']['mean_ms_per_sentence']:.1f}"
              f" ms. IAD {r['iad']['mean_ms_per_sentence']:.1f} ms: {r['iad']['speedup_vs_ct2']:.2f}x the fastest "
              f"of the run, {describe_mode(fastest, r[fastest])}")
    if int8:
        q = r["iad-int8"]
        same8 = sum(s["iad-int8"]["tokens"] == s["greedy-native-int8"]["tokens"] for s in res["per_sentence"])
        print(f"IAD on the int8 model: {q['mean_ms_per_sentence']:.1f} ms per sentence"
              + (f", {q['speedup_vs_ct2']:.2f}x {res['ct2_fastest']}" if has_ct2 else "")
              + f"; identical to that model's greedy on the engine: {same8}/{n} sentences (to the float32 "
              f"greedy: {q['identical_to_fp32_greedy']}/{n}"
              + (f"; CTranslate2's probe's pick: {r['ct2-best']['identical_to_fp32_greedy']}/{n}" if has_ct2 else "")
              + ")")
    print(f"(per-sentence JSON and the speedup-vs-edit-ratio plot: {js}, {work / 'bench.png'})")
    if same != n:
        sys.exit(f"error: IAD differed from greedy on {n - same} of {n} sentences")
    if int8 and same8 != n:
        sys.exit(f"error: IAD on the int8 model differed from its greedy on {n - same8} of {n} sentences")


if __name__ == "__main__":
    main()
