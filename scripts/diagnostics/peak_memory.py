"""Peak memory of decoding modes side by side (GAD's Table 16 on a CPU): each
mode in a process of its own loads the model (and its drafter), decodes the
first N sentences one at a time and reports its peak resident memory, beside
the same process that only loaded the model.

    python scripts/diagnostics/peak_memory.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--modes greedy,iad,beam5] [--sentences 50] [--drafter-path D.pt]

Modes: the benchmark's (``fairseq-aggressive-bench``; docs/benchmark.md):
``greedy``, ``greedy-native``, ``iad``, ``gad``, ``feature-ar`` (with
``--drafter-path``), ``beamN``, ``beamN-native``, their ``-int8`` forms, ...
"""
import argparse
import json
import os
import subprocess
import sys


def settings_of(mode: str, drafter_path=None) -> dict:
    """The generation settings of a benchmark mode (fairseq_aggressive.bench.modes)."""
    import argparse

    from fairseq_aggressive.bench.ct2 import COMPUTE_TYPES
    from fairseq_aggressive.bench.modes import mode_overrides

    if mode in COMPUTE_TYPES:
        raise SystemExit(f"error: unknown mode {mode!r}: CTranslate2 runs in a process of its own")
    args = argparse.Namespace(drafter_path=drafter_path, gad_beta=1, gad_tau=None, bench_shortlist=None)
    return mode_overrides(mode, args)


def child(model_dir: str, sentences_file: str, n: int, settings: dict) -> None:
    """In the child process: load, decode, print {"loaded": bytes, "peak": bytes}."""
    import resource

    from fairseq_aggressive.translator import Translator, load_hub

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    with open(sentences_file, encoding="utf-8") as f:
        lines = [ln.strip() for ln, _ in zip(f, range(n))]
    hub = load_hub(model_dir)
    loaded = rss()
    if settings.get("decoding", "beam") == "beam":  # fairseq's beam search, or the engine's
        for s in lines:
            hub.translate(s, **settings)
    else:  # a Translator decodes with beam 1
        t = Translator(hub, **{k: v for k, v in settings.items() if k != "beam"})
        for s in lines:
            t.translate(s)
    print(json.dumps({"loaded": loaded, "peak": rss()}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("sentences")
    p.add_argument("--modes", default="greedy-native,iad,beam5,beam5-native")
    p.add_argument("--sentences", dest="n", type=int, default=50)
    p.add_argument("--drafter-path", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.model_dir, args.sentences, args.n, json.loads(args.child))
        return 0
    if args.n < 1:
        raise SystemExit("error: --sentences must be >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    plans = {m: settings_of(m, args.drafter_path) for m in modes}
    rows = {}
    for m in modes:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), args.model_dir, args.sentences,
                               "--sentences", str(args.n), "--child", json.dumps(plans[m])],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: mode {m} failed:\n{proc.stderr[-2000:]}")
        rows[m] = json.loads(proc.stdout.strip().splitlines()[-1])
    from fairseq_aggressive.native.machine import describe_machine

    print(f"machine: {describe_machine()}; {args.n} sentences one at a time, each mode in its own process")
    base = modes[0]
    print(f"| mode | peak MiB | model loaded MiB | decoding adds MiB | x {base} peak |\n|---|---|---|---|---|")
    for m in modes:
        r = rows[m]
        print(f"| {m} | {r['peak'] / 2 ** 20:.0f} | {r['loaded'] / 2 ** 20:.0f} | "
              f"{(r['peak'] - r['loaded']) / 2 ** 20:.0f} | {r['peak'] / rows[base]['peak']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
