#!/usr/bin/env python
"""Whether a decoder loses more than its share of the CPUs beside busy processes:
the engine's stream (``Translator.translate_batch``, ``--rows`` rows in its lanes)
and CTranslate2 (length-sorted batches of ``--rows``, split among one-thread
workers, one per CPU), quiet and beside ``--load`` CPU-bound processes in turns in
one process, so that a drift of the host's speed falls on both alike.

    python scripts/diagnostics/cpu_share.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--rows 32] [--sentences 300] [--rounds 2] [--load 2] [--int8] [--no-ct2]

Prints per way and load the wall time and the process's CPU time a sentence (the
median of the rounds, after a warm-up) and the CPUs it held (CPU time / wall time).
Beside N busy processes on C CPUs a decoder whose threads get their fair share holds
about C x T / (T + N) CPUs (T: its busy threads) and spends as much CPU time a
sentence as quiet; more CPU time a sentence means each CPU second did less work
(caches, a convoy), fewer CPUs than its share means it waited (a lock, a barrier).
"""
import argparse
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("sentences_file")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load", type=int, default=2, help="CPU-bound processes beside the loaded rounds")
    ap.add_argument("--int8", action="store_true", help="int8 for both (CTranslate2: int8_float32)")
    ap.add_argument("--no-ct2", action="store_true", help="the engine only")
    a = ap.parse_args(argv)
    if a.rows < 1 or a.rounds < 1 or a.sentences < 1 or a.load < 0:
        ap.error("--rows, --rounds and --sentences must be >= 1, --load >= 0")

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.runtime.threads import usable_cpus
    from fairseq_aggressive.translator import Translator

    kw = dict(decoding="iad", max_draft_len=0, max_len_a=1.2, max_len_b=10)
    if a.int8:
        kw["inference_precision"] = "int8"
    t = Translator.from_pretrained(a.model_dir, **kw)
    with open(a.sentences_file, encoding="utf-8") as f:
        lines = [x.strip() for x in f if x.strip()][: a.sentences]
    cpus = usable_cpus()
    ways = {"engine stream": lambda: t.translate_batch(lines, rows=a.rows)}
    if not a.no_ct2:
        ways["CTranslate2"] = _ct2(t, lines, a, cpus)
    print(f"machine: {describe_machine(machine_info())}; {len(lines)} sentences, {a.rows} rows, "
          f"{'int8' if a.int8 else 'float32'}; loaded rounds beside {a.load} busy processes on {cpus} CPUs")
    res = {(w, load): [] for w in ways for load in (0, a.load)}
    for w in ways.values():
        w()  # warm-up (lanes made, the draft policy measured, CTranslate2's first batches)
    for r in range(a.rounds):
        for load in (0, a.load) if r % 2 == 0 else (a.load, 0):
            with cpu_load(load):
                for name, w in ways.items():
                    c0, w0 = time.process_time(), time.perf_counter()
                    w()
                    res[(name, load)].append((time.perf_counter() - w0, time.process_time() - c0))
    print("| way | load | wall ms a sentence | CPU ms a sentence | CPUs held |")
    print("|---|---|---|---|---|")
    for (name, load), runs in res.items():
        wall, cpu = statistics.median(x[0] for x in runs), statistics.median(x[1] for x in runs)
        n = len(lines)
        print(f"| {name} | {load} | {1000 * wall / n:.2f} | {1000 * cpu / n:.2f} | {cpu / wall:.2f} |")
    return 0


def _ct2(t, lines, a, cpus):
    """CTranslate2 on the same sentences: batches of ``a.rows`` by length (as fairseq's batches
    are), each split among one-thread workers, one per CPU; fairseq's length limit per batch."""
    import ctranslate2

    from fairseq_aggressive.bench.ct2 import converted_model
    from fairseq_aggressive.bench.ct2_worker import translate

    model = converted_model(os.path.join(a.model_dir, "model.pt"), a.model_dir)
    ct = ctranslate2.Translator(model, device="cpu", compute_type="int8_float32" if a.int8 else "float32",
                                inter_threads=cpus, intra_threads=1)
    sd = t.hub.src_dict
    toks = sorted(([sd[i] for i in t.encode(s).tolist()[:-1]] for s in lines), key=len)  # (no EOS: it adds its own)
    batches = [toks[i: i + a.rows] for i in range(0, len(toks), a.rows)]

    requests = [{"tokens": b, "max_len": int(1.2 * (max(map(len, b)) + 1)) + 10} for b in batches]

    def run():
        for r in requests:
            translate(ct, r, workers=cpus)
    return run


if __name__ == "__main__":
    sys.exit(main())
