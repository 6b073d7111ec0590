#!/usr/bin/env python
"""One sentence per call through fairseq's hub API, as a writing assistant
calls it: ``translate(sentence, beam=1, decoding=MODE)`` for every sentence, the
modes taking turns sentence by sentence, ``greedy`` being fairseq's own;
``translator:MODE`` calls a ``fairseq_aggressive.Translator`` (its generator
built once, each sentence's tokens handed to it directly) instead of the hub.

    python scripts/diagnostics/hub_latency.py MODEL-DIR --input FILE [--sentences 200]
        [--modes greedy iad ct2-best] [--checkpoint model.pt] [--source-lang L --target-lang L] [--load N]
        [--json F]

MODEL-DIR holds the checkpoint, its dictionaries and ``bpe.codes`` (as under
``models/``; the languages are read from its ``MODEL.json`` when not given);
FILE has one tokenized sentence per line.  Prints per mode the milliseconds per
sentence, those spent decoding (the task's ``inference_step``) and the rest
(fairseq's hub: BPE, batching, output strings; building the generator), its
speed against the first mode, in how many sentences its output equals the first
mode's, and the process's threads before and after (an aggressive mode keeps one
engine per calling thread, whatever the number of calls).  ``--json F`` writes
the same as a result (with its command, commit and machine) that
``scripts/results.py add`` stores; the ``hub-latency`` table shows it.
"""
import argparse
import os
import sys
import time

from fairseq_aggressive.bench.load import cpu_load


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1


def main(argv=None) -> int:
    from fairseq_aggressive.bench.provenance import output_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--input", required=True)
    ap.add_argument("--checkpoint", default="model.pt")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--modes", nargs="+", default=["greedy", "iad"],
                    help="greedy (fairseq's), a --decoding, translator:DECODING, or ct2-best")
    ap.add_argument("--source-lang")
    ap.add_argument("--target-lang")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")
    ap.add_argument("--json", type=output_file, default=None,
                    help="write the figures here (a result scripts/results.py stores)")
    a = ap.parse_args(argv)
    if a.sentences < 1 or len(set(a.modes)) != len(a.modes):
        ap.error("--sentences >= 1 and distinct --modes")
    from fairseq_aggressive.translator import Translator, load_hub, model_languages

    src, tgt = model_languages(a.model_dir)
    src, tgt = a.source_lang or src, a.target_lang or tgt
    with open(a.input, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:a.sentences]
    if not lines or not src or not tgt:
        ap.error("no sentences in --input" if not lines else "--source-lang and --target-lang (no MODEL.json)")

    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.native.running import RunningBatch

    hub = load_hub(a.model_dir, a.checkpoint, source_lang=src, target_lang=tgt)
    decoding = {"spent": 0.0}

    def timed(method):  # (its calls' time counts as decoding)
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                decoding["spent"] += time.perf_counter() - t0

        return call

    # the generator's batches, and the engine's running batch (a Translator whose decoding runs there)
    hub.task.inference_step = timed(hub.task.inference_step)
    for name in ("join", "run", "take"):
        setattr(RunningBatch, name, timed(getattr(RunningBatch, name)))

    ct2_call, configs = _ct2_best(hub, os.path.join(a.model_dir, a.checkpoint), a.model_dir, lines) \
        if "ct2-best" in a.modes else (None, {})
    names = {m: f"{m} ({c['compute_type']}, {c['threads']} thread{'s' if c['threads'] > 1 else ''})"
             for m, c in configs.items()}

    translators = {m: Translator(hub, decoding=m.split(":", 1)[1]) for m in a.modes if m.startswith("translator:")}

    def call(mode, s):
        if mode == "ct2-best":
            return ct2_call(s)
        if mode in translators:
            return translators[mode].translate(s)
        return hub.translate(s, beam=1) if mode == "greedy" else hub.translate(s, beam=1, decoding=mode)

    print(f"machine: {describe_machine(machine_info())}; {len(lines)} sentences, one per call; "
          f"{a.load} CPU-bound processes beside it")
    total = {m: 0.0 for m in a.modes}
    inside = {m: 0.0 for m in a.modes}
    outs = {m: [] for m in a.modes}
    with cpu_load(a.load):
        for m in a.modes:  # warm-up: each mode's generator, engine and caches
            call(m, lines[0])
        before = _threads()
        for i, s in enumerate(lines):
            j = i % len(a.modes)  # no mode always runs first
            for m in a.modes[j:] + a.modes[:j]:
                decoding["spent"] = 0.0
                t0 = time.perf_counter()
                outs[m].append(call(m, s))
                total[m] += time.perf_counter() - t0
                inside[m] += decoding["spent"]
        after = _threads()
    n, first = len(lines), a.modes[0]
    res = {"kind": "hub_latency", "sentences": n, "load": a.load, "first": first, "modes": {},
           "threads_of_the_process": {"after_warm_up": before, "after_calls": after}}
    for m in a.modes:
        same = sum(x == y for x, y in zip(outs[m], outs[first]))
        split = "" if m == "ct2-best" else \
            f" (decoding {1000 * inside[m] / n:.2f}, the rest {1000 * (total[m] - inside[m]) / n:.2f})"
        print(f"{names.get(m, m)}: {1000 * total[m] / n:.2f} ms per sentence{split}; "
              f"{total[first] / total[m]:.2f}x {first}; the same output as {first} in {same}/{n}")
        row = res["modes"][m] = {"mean_ms_per_sentence": 1000 * total[m] / n, f"identical_to_{first}": same}
        if m == "ct2-best":
            row["ct2_config"] = configs[m]
        else:
            row["decoding_ms"] = 1000 * inside[m] / n
    print(f"threads of the process: {before} after the warm-up, {after} after {n} calls per mode")
    if a.json:
        from fairseq_aggressive.bench.provenance import write_result

        write_result(a.json, res, "scripts/diagnostics/hub_latency.py")
    return 0


def _ct2_best(hub, ckpt, model_dir, lines):
    """(call(sentence) -> output, {"ct2-best": its configuration}): CTranslate2 at its fastest
    configuration on this machine, the hub's BPE around it, fairseq's length cap."""
    import ctranslate2

    from fairseq_aggressive.bench import ct2
    from fairseq_aggressive.runtime.threads import usable_cpus

    max_len = int(hub.cfg.generation.max_len_b)  # the hub's cap (max_len_a is 0 there)
    ct2_dir = ct2.converted_model(ckpt, model_dir)
    probe = [{"tokens": [hub.apply_bpe(hub.tokenize(s)).split()], "max_len": max_len}
             for s in lines[:ct2.PROBE_SENTENCES]]
    best = ct2.tune(ct2_dir, probe, ct2.thread_counts(usable_cpus()), min(5, len(probe)))
    translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=best["compute_type"],
                                        inter_threads=1, intra_threads=best["threads"])

    def call(s):
        tokens = hub.apply_bpe(hub.tokenize(s)).split()
        hyp = translator.translate_batch([tokens], beam_size=1, max_decoding_length=max_len,
                                         min_decoding_length=1)[0].hypotheses[0]
        return hub.detokenize(hub.remove_bpe(" ".join(hyp)))

    return call, {"ct2-best": {"compute_type": best["compute_type"], "threads": best["threads"]}}


if __name__ == "__main__":
    sys.exit(main())
