#!/usr/bin/env python
"""The translation demo: the shipped en-de student, greedy against its drafters and CTranslate2.

    python scripts/demo_mt.py     # make demo-mt

Decodes the 300 English sentences of the bundled sample (data/debian-ende-sample, never seen in
training) with the shipped distilled student (models/ende-student-6x1: 6 encoder layers, 1
decoder layer, d=128), first with ``fairseq-generate --decoding feature-ar`` and its shipped
feature drafter, then side by side at batch 1 with ``fairseq-aggressive-bench``: fairseq's
greedy, the native engine's greedy, the feature drafter (k=4 and 8; k=8 also as an int8 copy,
``--drafter-precision int8``), GAD's block drafter and,
where it is installed, CTranslate2 at its fastest configuration on the machine; and checks that
every drafted mode's output is greedy's on every sentence.

The speed numbers are printed with the machine they were measured on; docs/cpu-translation.md
says what they mean (at d=128 a drafted pass costs about what the steps it saves cost).
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

from demo import sh, tool  # scripts/demo.py

from fairseq_aggressive.data_prep import common as prep_common

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "debian-ende-sample"
STUDENT = ROOT / "models" / "ende-student-6x1"
FEATURE_DRAFTER = ROOT / "models" / "ende-student-6x1-feature-drafter"
GAD_DRAFTER = ROOT / "models" / "ende-student-6x1-gad-drafter"
USER_DIR = str(ROOT / "fairseq_aggressive")
LEN = ["--max-len-a", "1.2", "--max-len-b", "10"]
MIN_TOKENS_PER_PASS = 2.0  # the feature drafter accepts ~5 on this sample; a broken one ~1
DRAFTED = ("feature-ar@4", "feature-ar@8", "feature-ar@8-dint8", "gad@8")


def sample_data(work: Path) -> Path:
    """The sample in the student's BPE and vocabulary (work/demo-mt/data/bin)."""
    for path in (STUDENT / "model.pt", STUDENT / "bpe.codes", STUDENT / "dict.en.txt",
                 FEATURE_DRAFTER / "model.pt", GAD_DRAFTER / "model.pt"):
        if not path.is_file():
            sys.exit(f"error: the shipped models are incomplete: {path} is missing")
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = prep_common.read_lines(SAMPLE / f"test.tok.{lang}")
        prep_common.write_lines(out / f"test.{lang}", prep_common.apply_bpe(STUDENT / "bpe.codes", lines))
    binned = prep_common.binarize(out, "en", "de", workers=1, splits=("test",), dictionary=STUDENT / "dict.en.txt")
    meta = json.loads((STUDENT / "MODEL.json").read_text())
    print(f"model: {STUDENT.relative_to(ROOT)} ({meta['encoder_layers']}+{meta['decoder_layers']} layers, "
          f"d={meta['embed_dim']}, {meta['parameters']:,} parameters, distilled from a 6+6 teacher's greedy "
          f"outputs); drafters: {FEATURE_DRAFTER.relative_to(ROOT)}, {GAD_DRAFTER.relative_to(ROOT)}")
    return binned


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=os.environ.get("WORK", str(ROOT / "work")))
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of every engine (default: each engine's own default)")
    ap.add_argument("--load", type=int, default=0,
                    help="decode beside N CPU-bound processes (fairseq-aggressive-bench --bench-load N)")
    ap.add_argument("--sentences", type=int, default=None,
                    help="benchmark only the first N sentences (default all 300)")
    args = ap.parse_args(argv)
    work = Path(args.work) / "demo-mt"
    work.mkdir(parents=True, exist_ok=True)
    from fairseq_aggressive.native.machine import describe_machine

    print(f"machine: {describe_machine()}")
    print("== 1/3 model and data")
    data = sample_data(work)
    common = [str(data), "--path", str(STUDENT / "model.pt"), "--user-dir", USER_DIR, "--source-lang", "en",
              "--target-lang", "de", "--gen-subset", "test", "--remove-bpe", *LEN]

    print("== 2/3 fairseq-generate --decoding feature-ar --block-size 8 --batch-size 32 (first hypotheses)")
    proc = sh([tool("fairseq-generate"), *common, "--task", "aggressive_translation", "--beam", "1",
               "--decoding", "feature-ar", "--drafter-path", str(FEATURE_DRAFTER / "model.pt"), "--block-size", "8",
               "--batch-size", "32"])
    (work / "generate.out").write_text(proc.stdout)
    for line in [l for l in proc.stdout.splitlines() if l[:2] in ("S-", "H-")][:6]:
        print("  " + line)
    m = re.search(r"aggressive decoding \(feature-ar\): .*?([\d.]+) tokens accepted per pass", proc.stderr)
    if not m:
        sys.exit("error: fairseq-generate printed no aggressive decoding summary:\n" + proc.stderr[-2000:])
    print("  " + m.group(0))
    if float(m.group(1)) < MIN_TOKENS_PER_PASS:
        sys.exit(f"the drafter is not usable: it got {float(m.group(1)):.2f} tokens accepted per pass "
                 f"(the shipped one gets ~5); not benchmarking it")

    import importlib.util

    has_ct2 = importlib.util.find_spec("ctranslate2") is not None  # make setup installs it
    modes = ["greedy", "greedy-native", *DRAFTED] + (["ct2-best"] if has_ct2 else [])
    print(f"== 3/3 {', '.join(modes)}, batch 1" + (f", {args.threads} threads" if args.threads else "")
          + (f", beside {args.load} CPU-bound processes" if args.load else "") + " (fairseq-aggressive-bench)")
    js = work / "bench.json"
    proc = sh([tool("fairseq-aggressive-bench"), *common, "--batch-size", "1",
               "--drafter-path", str(GAD_DRAFTER / "model.pt"),
               "--bench-feature-drafter", str(FEATURE_DRAFTER / "model.pt"),
               *(["--threads", str(args.threads)] if args.threads else []), "--bench-load", str(args.load),
               *(["--bench-max-sentences", str(args.sentences)] if args.sentences else []),
               "--bench-modes", ",".join(modes), "--bench-json", str(js)])
    print(proc.stdout.rstrip())
    res = json.loads(js.read_text())
    n, r = res["sentences"], res["modes"]
    bad = {mode: n - r[mode]["identical_to_greedy"] for mode in DRAFTED if r[mode]["identical_to_greedy"] != n}
    for mode in DRAFTED:
        print(f"{mode}: output identical to greedy on {r[mode]['identical_to_greedy']}/{n} sentences, "
              f"{r[mode]['mean_tokens_per_pass']:.2f} tokens per pass, "
              f"{r[mode]['mean_ms_per_sentence']:.2f} ms per sentence "
              f"(the engine's greedy {r['greedy-native']['mean_ms_per_sentence']:.2f})")
    if has_ct2:
        from fairseq_aggressive.bench.report import describe_mode

        print(f"CTranslate2 at the configuration its probe found fastest here, {describe_mode('ct2-best', r['ct2-best'])}: "
              f"{r['ct2-best']['mean_ms_per_sentence']:.2f} ms per sentence")
    print(f"(per-sentence JSON: {js})")
    if bad:
        sys.exit("error: drafted output differed from greedy: "
                 + ", ".join(f"{mode} on {k} of {n} sentences" for mode, k in bad.items()))


if __name__ == "__main__":
    main()
