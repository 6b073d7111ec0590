#!/usr/bin/env python
"""The CPU engine's results tables, measured on this machine in one resumable run.

    python scripts/experiments/cpu_engine_tables.py [--work work] [--out DIR] [--parts ct2 exact ...]
        [--models 3x2 9x3 d512 d1024] [--loads 0 2] [--avx2-only] [--sentences-scale F] [--dry-run]
    python scripts/experiments/cpu_engine_tables.py --summary [--out DIR]
    python scripts/experiments/cpu_engine_tables.py ... --store results/cpu-engine

What docs/results-build-targets.md, docs/pass-cost.md, docs/engine-kernels.md and docs/threads-and-load.md
report, by part:

- ``ct2``: the shipped 3+2 and 9+3 UA-GEC models and the 9+3 widened to Transformer-base
  (d=512) and Transformer-big (d=1024) layers, the engine's greedy and IAD in float32 and int8
  (and their generator loops in Python, ``-pyloop``) against CTranslate2's fastest configuration
  of the run (``ct2-best``), batch 1, quiet and beside two CPU-bound processes (``--loads``);
- ``exact``: every exact mode against fairseq's greedy of the same model (int8 modes: fairseq's
  greedy of the same int8 model, near-ties counted), quiet;
- ``workers``: W = 2 and 4 decoders on one copy of the weights (each model chosen), sentences per
  second and resident memory, against CTranslate2 with ``inter_threads`` = W;
- ``pass``: what one verification pass over T positions costs against a step, d=512
  (``scripts/diagnostics/pass_cost.py``), and the same right after a 12-token prefix and after
  4 one-token steps (the middle of a sentence), quiet and beside ``--loads``;
- ``amx``: on a CPU whose AMX tiles the engine can use, the int8 kernels by rows on the tiles
  and on the vector tiles (``linear_rate.py``), and decodes on both targets in one run.

Each run writes OUT/NAME.txt (and NAME.json for the benchmark's runs) once it has finished; a run
whose output is there is skipped, so an interrupted run resumes where it stopped (remove a file
to redo its run).  The UA-GEC data (``scripts/data/prepare_uagec.py``) and the widened models
(``widen_model.py``) are made first where missing.  At the end, and with ``--summary``, each
run's table is printed under its command.

``--store results/TOPIC`` stores each finished benchmark run there as a result
(``scripts/results.py add``: its command, commit, machine and the model's label), from which the
docs' tables are made; the runs already done are stored without running again.

``--avx2-only`` runs both engines on AVX2 code only: the engine's ``avx2`` target, and oneDNN
(CTranslate2's and torch's products) and CTranslate2's own kernels capped at AVX2; on a CPU with
AVX-512 that stands in, as far as code goes, for one without it.  ``--sentences-scale 0.05``
makes a smoke run of a few minutes.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name, checkpoint ({work}: --work), sentences of the test set; the label the tables give it
LABELS = {"3x2": "3+2, d=128", "9x3": "9+3, d=128", "d512": "d=512", "d1024": "d=1024"}
MODELS = [("3x2", "models/uagec-3x2/model.pt", 600), ("9x3", "models/uagec-9x3/model.pt", 600),
          ("d512", "{work}/wide/d512.pt", 200), ("d1024", "{work}/wide/d1024.pt", 60)]
WIDE = {"d512": ["--dim", "512", "--ffn", "2048", "--heads", "8"],
        "d1024": ["--dim", "1024", "--ffn", "4096", "--heads", "16"]}
COMMON = ["--gen-subset", "test", "--remove-bpe", "--batch-size", "1", "--max-len-a", "1.2", "--max-len-b", "10",
          "--warmup", "10"]
CT2_MODES = "greedy-native,greedy-native-pyloop,iad,iad-pyloop,greedy-native-int8,iad-int8,iad-int8-pyloop,ct2-best"
EXACT_MODES = "greedy,greedy-native,iad,greedy-int8,greedy-native-int8,iad-int8"
AMX_MODES = "greedy-native-int8:avx512vnni,iad-int8:avx512vnni,greedy-native-int8,iad-int8,ct2-best"
PARTS = ("ct2", "exact", "workers", "pass", "amx")
AVX2_ENV = {"FAIRSEQ_AGGRESSIVE_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2"}


def runs(args, work: Path, out: Path, amx: bool):
    """(name, argv) of every run the options select, in order."""
    from fairseq_aggressive.data_prep.common import console_script

    bench, py = console_script("fairseq-aggressive-bench"), sys.executable
    data = str(work / "uagec" / "bin")
    models = [(n, c.format(work=work), max(1, round(s * args.sentences_scale))) for n, c, s in MODELS
              if n in args.models]

    def bench_run(name, ckpt, sentences, *extra):
        return (name, [bench, data, "--path", ckpt, *COMMON, "--bench-max-sentences", str(sentences), *extra,
                       "--bench-json", str(out / f"{name}.json")])

    if "ct2" in args.parts:
        for n, ckpt, s in models:
            for load in args.loads:
                yield bench_run(f"ct2-{n}-load{load}", ckpt, s, "--bench-modes", CT2_MODES, "--bench-load", str(load))
    if "exact" in args.parts:
        for n, ckpt, s in models:
            yield bench_run(f"exact-{n}", ckpt, s, "--bench-modes", EXACT_MODES)
    if "workers" in args.parts:
        for n, ckpt, s in models:
            yield bench_run(f"workers-{n}-w1", ckpt, s, "--bench-modes", "iad,iad-int8", "--bench-workers", "1",
                            "--bench-worker-kind", "threads")
            for w in (2, 4):
                for load in args.loads:
                    yield bench_run(f"workers-{n}-w{w}-load{load}", ckpt, s, "--bench-modes",
                                    "iad,iad-int8,ct2-best", "--bench-workers", str(w), "--bench-worker-kind",
                                    "threads", "--bench-load", str(load))
    if "pass" in args.parts and "d512" in args.models:
        cost = [py, str(ROOT / "scripts" / "diagnostics" / "pass_cost.py"), data, "--path",
                str(work / "wide" / "d512.pt"), "--sentences", str(max(1, round(60 * args.sentences_scale))),
                "--threads", "1", "--rounds", "3"]
        for p in ("float32", "int8"):
            yield (f"pass-d512-{p}", cost + ["--positions", "1,2,3,4,5,6,8", "--prefix", "8", "--precision", p,
                                             "--json", str(out / f"pass-d512-{p}.json")])
        # the same place of the same sentences right after the prefix and in the middle of a sentence
        for p in ("float32", "int8"):
            for load in args.loads:
                for tag, where in (("after12", ["--prefix", "12"]), ("warm4", ["--prefix", "8", "--warm-steps", "4"])):
                    name = f"pass-d512-{p}-{tag}-load{load}"
                    yield (name, cost + ["--positions", "1,2,4,5,6,8", "--precision", p, "--load", str(load)] + where
                           + ["--json", str(out / f"{name}.json")])
    if "amx" in args.parts and amx:
        rate = [py, str(ROOT / "scripts" / "diagnostics" / "linear_rate.py"), "--isa", "avx512amx", "--precision",
                "int8", "--rows", "1,2,3,4,5,6,8,9,10,12,16", "--threads", "1", "2", "--decoder-layers", "3"]
        for dim, tag in ((512, ""), (1024, "-d1024")):
            shape = ["--dim", str(dim), "--ffn", str(4 * dim)]
            yield (f"amx-rate{tag}-tiles", rate + shape + ["--amx-min-rows", "1"])
            yield (f"amx-rate{tag}-vectors", rate + shape + ["--amx-min-rows", "99"])
        for n, ckpt, s in models:
            if n in ("d512", "d1024"):
                for load in args.loads:
                    yield bench_run(f"amx-{n}-load{load}", ckpt, s, "--bench-modes", AMX_MODES, "--bench-load",
                                    str(load))


def cpu_line() -> str:
    """The CPU's model name, family and model, and its vector flags, from /proc/cpuinfo."""
    info, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags":
                    flags = set(value.split())
                elif key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = value.strip()
    except OSError:
        return "no /proc/cpuinfo"
    vec = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "avx_vnni", "fma"))
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}), "
            f"{' '.join(vec)}")


def run(argv, log: Path, env, dry: bool) -> bool:
    line = " ".join(shlex.quote(str(a)) for a in argv)
    print(f"$ {line}", flush=True)
    if dry:
        return True
    part = log.with_name(log.name + ".part")
    with open(part, "w") as f:
        f.write(f"$ {line}\n")
        f.flush()
        rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        print(f"  failed (exit {rc}): see {part}", flush=True)
        return False
    part.rename(log)
    return True


def prepare(work: Path, args, env) -> bool:
    """The data and the widened models the selected runs read, made where missing."""
    ok = True
    if not (work / "uagec" / "bin").is_dir():
        ok &= run([sys.executable, str(ROOT / "scripts" / "data" / "prepare_uagec.py"), "--out",
                   str(work / "uagec")], work / "prepare-uagec.log", env, args.dry_run)
    for n, flags in WIDE.items():
        ckpt = work / "wide" / f"{n}.pt"
        if n in args.models and not ckpt.exists():
            if not args.dry_run:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
            ok &= run([sys.executable, str(ROOT / "scripts" / "experiments" / "widen_model.py"),
                       str(ROOT / "models" / "uagec-9x3" / "model.pt"), str(ckpt), *flags],
                      work / "wide" / f"{n}.log", env, args.dry_run)
    return ok


def table_of(text: str) -> str:
    """The first markdown table a run printed, with the two lines above it (the benchmark's machine
    and run lines), or the lines of pass_cost.py's and linear_rate.py's results."""
    lines = text.splitlines()
    for i in range(len(lines) - 1):
        if lines[i].startswith("| ") and lines[i + 1].startswith("|---"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            head = [line for line in lines[max(0, i - 2):i] if not line.startswith(("INFO", "WARNING"))]
            return "\n".join(head + lines[i:j])
    return "\n".join(line for line in lines if line.startswith(("T=", "machine"))) or "(no table)"


def summary(out: Path) -> None:
    if (out / "machine.md").exists():
        print((out / "machine.md").read_text().strip())
    for f in sorted(out.glob("*.txt")):
        text = f.read_text(errors="replace")
        first = text.splitlines()[0] if text else ""
        print(f"\n## {f.stem}\n\n`{first[2:] if first.startswith('$ ') else first}`\n")
        print(table_of(text))


def store(out: Path, dest: Path, names, avx2_only: bool, work: Path) -> int:
    """Each finished run among ``names`` stored under ``dest`` with its model's label and its command
    as typed from the repository's root (the AVX2 caps in front; the data and models under ``work``
    as work/..., the run's own output as OUT/...); the number stored."""
    from fairseq_aggressive.bench.results import stored

    env = " ".join(f"{k}={v}" for k, v in AVX2_ENV.items()) + " " if avx2_only else ""
    here = [(str(out.resolve()) + os.sep, "OUT/"), (os.path.relpath(out.resolve(), ROOT) + os.sep, "OUT/"),
            (str(work.resolve()) + os.sep, "work/"), (str(ROOT) + os.sep, "")]
    done = 0
    for name in names:
        src = out / f"{name}.json"
        if not src.exists() or not (out / f"{name}.txt").exists():
            continue
        res = json.loads(src.read_text())
        model = next(m for m in LABELS if f"-{m}-" in f"-{name}-")
        command = res["command"]
        for path, as_typed in here:
            command = command.replace(path, as_typed)
        command = env + command
        dest.mkdir(parents=True, exist_ok=True)
        tmp = dest / f"{name}.json.tmp"
        tmp.write_text(json.dumps(stored(res, LABELS[model], command), indent=1, sort_keys=True) + "\n")
        tmp.replace(dest / f"{name}.json")
        done += 1
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="work", help="the data and the widened models (default: work)")
    ap.add_argument("--out", help="the runs' outputs (default: WORK/cpu-engine, WORK/cpu-engine-avx2 with --avx2-only)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--models", nargs="+", choices=[m[0] for m in MODELS], default=[m[0] for m in MODELS])
    ap.add_argument("--loads", nargs="+", type=int, default=[0, 2], help="CPU-bound processes beside each run")
    ap.add_argument("--avx2-only", action="store_true", help="both engines on AVX2 code only")
    ap.add_argument("--sentences-scale", type=float, default=1.0, help="a fraction of each run's sentences")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--summary", action="store_true", help="print the tables of the finished runs and exit")
    ap.add_argument("--store", metavar="DIR", help="store each finished benchmark run under DIR (results/TOPIC) as a "
                    "result the docs' tables are made from")
    args = ap.parse_args(argv)
    if args.sentences_scale <= 0:
        ap.error("--sentences-scale must be > 0")
    work = (ROOT / args.work).resolve() if not os.path.isabs(args.work) else Path(args.work)
    out = Path(args.out) if args.out else work / ("cpu-engine-avx2" if args.avx2_only else "cpu-engine")
    if args.summary:
        summary(out)
        return 0
    env = dict(os.environ, **(AVX2_ENV if args.avx2_only else {}))
    from fairseq_aggressive.native import build
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    amx = not args.avx2_only and "avx512amx" in build.runnable_targets()
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        (out / "machine.md").write_text(f"{describe_machine(machine_info())}; {cpu_line()}; AMX tiles: "
                                        f"{'yes' if amx else 'no'}; "
                                        f"{'AVX2 code only' if args.avx2_only else 'every target'}\n")
    if not prepare(work, args, env):
        return 1
    failed = []
    for name, argv_ in runs(args, work, out, amx):
        if (out / f"{name}.txt").exists():
            print(f"(done: {out / name}.txt)")
            continue
        if not run(argv_, out / f"{name}.txt", env, args.dry_run):
            failed.append(name)
    if not args.dry_run:
        summary(out)
    if args.store and not args.dry_run:
        names = [n for n, argv_ in runs(args, work, out, amx) if "--bench-json" in argv_ or "--json" in argv_]
        print(f"\nstored {store(out, Path(args.store), names, args.avx2_only, work)} run(s) under {args.store}")
    if failed:
        print(f"\nfailed: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
