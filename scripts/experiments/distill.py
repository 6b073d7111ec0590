#!/usr/bin/env python
"""Sequence-level knowledge distillation (Kim & Rush 2016) for fairseq data.

Decodes the training set of a binarized fairseq data directory with a teacher
(beam 5 by default) and binarizes the (source, teacher output) pairs with the
*same* dictionaries, so the verifier and the drafter trained on the result
share the teacher and the vocabulary.  valid/test are linked from the original
data (evaluate against the real references).

    python scripts/experiments/distill.py --teacher T.pt --data DATA/bin --out DATA/distill

Large training sets: ``--num-shards N --shard-ids 0,1`` decodes only those
shards (fairseq-generate splits its input by ``--distributed-world-size N
--distributed-rank I``; one shard per GPU, or a fraction of the data on a
CPU); the shards decoded are concatenated.  Extra
``fairseq-generate`` options go after ``--``.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def detect_langs(data: str):
    found = sorted(glob.glob(os.path.join(data, "train.*-*.*.idx")))
    if not found:
        raise SystemExit(f"error: {data} has no binarized train split (train.SRC-TGT.*.idx)")
    m = re.match(r"train\.([^.-]+)-([^.-]+)\.", os.path.basename(found[0]))
    return m.group(1), m.group(2)


def parse_generate(path: str):
    """id -> (source, hypothesis) from fairseq-generate output (BPE kept)."""
    from fairseq_aggressive.evaluation.generate_output import read_generate_output

    entries = {i: e for i, e in read_generate_output(path).items() if "S" in e}
    missing = [i for i, e in entries.items() if "H" not in e]
    if missing:
        raise SystemExit(f"error: {len(missing)} sources without hypotheses in {path}")
    return {i: (e["S"], e["H"]) for i, e in entries.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True, help="teacher checkpoint")
    ap.add_argument("--data", required=True, help="binarized data dir (train/valid/test, dicts)")
    ap.add_argument("--out", required=True, help="output dir (bin/ and text files)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=6000)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--shard-ids", default=None, help="comma-separated shards to decode (default all)")
    ap.add_argument("--max-shards", type=int, default=None,
                    help="decode only the first N of the selected shards (a bounded CPU run that "
                    "gives the same data on every machine)")
    ap.add_argument("--user-dir", default=None, help="plugin dir (default: the installed fairseq_aggressive)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--workers", type=int, default=1)
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]

    src, tgt = detect_langs(args.data)
    shard_ids = list(range(args.num_shards)) if args.shard_ids is None else [
        int(s) for s in args.shard_ids.split(",")]
    if args.max_shards is not None:
        if args.max_shards < 1:
            raise SystemExit(f"error: --max-shards must be >= 1, got {args.max_shards}")
        shard_ids = shard_ids[: args.max_shards]
    if any(not 0 <= s < args.num_shards for s in shard_ids):
        raise SystemExit(f"error: --shard-ids must lie in 0..{args.num_shards - 1}")
    if not os.path.isfile(args.teacher):
        raise SystemExit(f"error: no teacher checkpoint at {args.teacher}")
    user_dir = args.user_dir or os.path.dirname(__import__("fairseq_aggressive").__file__)
    if os.path.exists(os.path.join(args.out, "bin")):
        raise SystemExit(f"error: {args.out}/bin exists; remove it or choose another --out")
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=args.out, prefix=".distill-")

    pairs = {}
    t0 = time.time()
    for shard in shard_ids:
        log = os.path.join(args.out, f"generate.train.shard{shard}.txt")
        cmd = [
            sys.executable, "-m", "fairseq_cli.generate", args.data, "--user-dir", user_dir,
            "--task", "aggressive_translation", "-s", src, "-t", tgt,
            "--path", args.teacher, "--gen-subset", "train", "--beam", str(args.beam),
            "--max-tokens", str(args.max_tokens),
            # every training pair (fairseq's batching drops a last batch that is not a multiple of it)
            "--required-batch-size-multiple", "1",
            # fairseq-generate shards its input by the distributed world size/rank
            # (a single process when no init method is given)
            "--distributed-world-size", str(args.num_shards), "--distributed-rank", str(shard),
            "--skip-invalid-size-inputs-valid-test",
            "--num-workers", "0",
        ] + (["--cpu"] if args.cpu else []) + extra
        print("+", " ".join(cmd), flush=True)
        with open(log, "w", encoding="utf-8") as f:
            subprocess.run(cmd, stdout=f, check=True)
        shard_pairs = parse_generate(log)
        print(f"shard {shard}: {len(shard_pairs)} sentences distilled", flush=True)
        pairs.update({(shard, i): p for i, p in shard_pairs.items()})
    elapsed = time.time() - t0

    keys = sorted(pairs)
    pref = os.path.join(tmp, "train")
    with open(f"{pref}.{src}", "w", encoding="utf-8") as fs, open(f"{pref}.{tgt}", "w", encoding="utf-8") as ft:
        for k in keys:
            s, h = pairs[k]
            fs.write(s + "\n")
            ft.write(h + "\n")
    bin_tmp = os.path.join(tmp, "bin")
    subprocess.run([
        sys.executable, "-m", "fairseq_cli.preprocess", "-s", src, "-t", tgt,
        "--trainpref", pref, "--srcdict", os.path.join(args.data, f"dict.{src}.txt"),
        "--tgtdict", os.path.join(args.data, f"dict.{tgt}.txt"), "--destdir", bin_tmp,
        "--workers", str(args.workers),
    ], check=True)
    for split in ("valid", "test"):
        for f in glob.glob(os.path.join(args.data, f"{split}*.{src}-{tgt}.*")) + glob.glob(
                os.path.join(args.data, f"{split}.{src}-{tgt}.*")):
            dst = os.path.join(bin_tmp, os.path.basename(f))
            if not os.path.exists(dst):
                shutil.copyfile(f, dst)
    for lang in (src, tgt):
        shutil.move(f"{pref}.{lang}", os.path.join(args.out, f"train.distill.{lang}"))
    os.replace(bin_tmp, os.path.join(args.out, "bin"))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"distilled {len(keys)} training pairs with beam {args.beam} in {elapsed / 60:.1f} min "
          f"-> {args.out}/bin (dictionaries of {args.data})")


if __name__ == "__main__":
    main()
