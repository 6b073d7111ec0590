"""``fairseq-aggressive-bench --bench-workers W``: decoding as a service with W
workers runs it.

For each mode, W decoders start at once on a shared input (W processes, or
with ``--bench-worker-kind threads`` W decoder threads of one process that
share one copy of the native engine's weights): worker k
decodes sentences k, k + W, k + 2W, ... one request (batch) at a time, with
``threads`` threads (``--threads``, default the CPUs this process may use
divided by W).  Each worker loads the model and decodes ``--warmup`` batches,
then all start together; the result is the sentences per second of all
workers together (sentences / the time from the first worker's start to the
last one's end) and the per-request latency (p50 / p95), and the peak resident memory of the
processes summed.  CTranslate2 modes run one
translator with ``inter_threads=W`` and W client threads (its own way of
serving W requests at once).  ``--bench-load N`` runs beside all of it.

A worker process is this module run as a script with one JSON argument
(:func:`worker`); it speaks to the benchmark over its standard input and output.
"""
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import torch

from ..native.machine import describe_machine, machine_info
from ..generator import length_cap
from ..runtime.threads import usable_cpus
from . import ct2
from .ct2 import COMPUTE_TYPES, CT2Error
from .load import cpu_load
from .modes import mode_overrides
from .options import add_bench_args
from .report import describe_load, describe_mode
from .run import gen_args_for

logger = logging.getLogger("fairseq_aggressive.bench")

READY = "FAIRSEQ-AGGRESSIVE-WORKER-READY"


def _load(argv):
    """(cfg, bench args, task, dataset, sentence count) for the bench's command line."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf


    parser = options.get_generation_parser(default_task="aggressive_translation")
    add_bench_args(parser)
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.gen_subset)
    dataset = task.dataset(cfg.dataset.gen_subset)
    n = len(dataset) if args.bench_max_sentences is None else min(len(dataset), args.bench_max_sentences)
    return cfg, args, task, dataset, n


def _shard_batches(dataset, n: int, k: int, workers: int, bsz: int):
    ids = list(range(n))[k::workers]
    return [dataset.collater([dataset[i] for i in ids[j : j + bsz]]) for j in range(0, len(ids), bsz)]


def peak_rss() -> int:
    """The peak resident memory of this process so far, in bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def worker(spec: Dict) -> None:
    """One worker process: load, build one generator per decoder thread (on one
    copy of the native engine's weights), warm up, say ready, wait for the
    start, decode the shards, one thread per shard."""
    import threading

    from fairseq import checkpoint_utils, utils

    import fairseq_aggressive  # noqa: F401

    torch.set_num_threads(spec["threads"])
    cfg, args, task, dataset, n = _load(spec["argv"])
    models, _ = checkpoint_utils.load_model_ensemble(utils.split_paths(cfg.common_eval.path), task=task)
    model = models[0].eval()
    gen_args = gen_args_for(cfg.generation, dict(mode_overrides(spec["mode"], args), native_threads=spec["threads"]))
    gens = [task.build_generator([model], gen_args)]
    for _ in spec["shards"][1:]:  # the other decoders read the first one's weights
        share = getattr(gens[0], "native", None)
        gens.append(task.build_generator([model], gen_args, **({"native_share": share} if share else {})))
    bsz = cfg.dataset.batch_size or 1
    shards = [_shard_batches(dataset, n, k, spec["workers"], bsz) for k in spec["shards"]]
    for gen, batches in zip(gens, shards):
        for sample in batches[: args.warmup]:
            gen.generate([model], sample)
    print(READY, flush=True)
    sys.stdin.readline()  # the start
    start = time.monotonic()  # one clock for every process of the machine
    recs: List[List[Dict]] = [[] for _ in shards]
    errors: List[BaseException] = []

    def decode(k: int) -> None:
        try:
            for sample in shards[k]:
                t0 = time.perf_counter()
                hypos = gens[k].generate([model], sample)
                dt = time.perf_counter() - t0
                for sid, h in zip(sample["id"].tolist(), hypos):
                    recs[k].append({"id": sid, "seconds": dt, "tokens": h[0]["tokens"].tolist()})
        except BaseException as e:  # noqa: B036 - reported by the main thread
            errors.append(e)

    if len(shards) == 1:
        decode(0)
    else:
        threads = [threading.Thread(target=decode, args=(k,)) for k in range(len(shards))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    end = time.monotonic()
    with open(spec["out"], "w") as f:
        json.dump({"start": start, "end": end, "requests": [r for rs in recs for r in rs],
                   "peak_rss": peak_rss()}, f)


def _run_processes(argv, mode: str, workers: int, threads: int, kind: str = "processes") -> Dict:
    """``mode`` served by W decoders started together: W processes (``kind``
    processes) or one process with W decoder threads (threads); their
    requests, the wall time and the processes' peak resident memory summed."""
    groups = [[k] for k in range(workers)] if kind == "processes" else [list(range(workers))]
    with tempfile.TemporaryDirectory(prefix="fa-workers-") as tmp:
        procs, logs = [], []
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        for k, shards in enumerate(groups):
            spec = dict(argv=argv, mode=mode, shards=shards, workers=workers, threads=threads,
                        out=os.path.join(tmp, f"{k}.json"))
            log = open(os.path.join(tmp, f"{k}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "fairseq_aggressive.bench.workers", json.dumps(spec)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                          env=env))
        try:
            for k, p in enumerate(procs):
                for line in p.stdout:
                    if line.strip() == READY:
                        break
                else:
                    p.wait()
                    logs[k].seek(0)
                    raise RuntimeError(f"worker {k} of {mode} exited before it was ready:\n"
                                       + logs[k].read()[-2000:])
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            for k, p in enumerate(procs):
                if p.wait() != 0:
                    logs[k].seek(0)
                    raise RuntimeError(f"worker {k} of {mode} failed:\n" + logs[k].read()[-2000:])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        recs, starts, ends, rss = [], [], [], 0
        for k in range(len(groups)):
            with open(os.path.join(tmp, f"{k}.json")) as f:
                res = json.load(f)
            recs += res["requests"]
            starts.append(res["start"])
            ends.append(res["end"])
            rss += res["peak_rss"]
    # from the first worker's start to the last one's end (not counting the processes' exit)
    return {"wall": max(ends) - min(starts), "requests": recs, "peak_rss": rss}


def _run_ct2(mode, cfg, args, task, dataset, n, workers, threads) -> Dict:
    from fairseq import checkpoint_utils, utils


    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    models, _ = checkpoint_utils.load_model_ensemble(utils.split_paths(cfg.common_eval.path), task=task)
    max_pos = models[0].max_decoder_positions()
    model_dir = ct2.converted_model(cfg.common_eval.path, cfg.task.data)
    gen = cfg.generation
    shards, ids = [], []
    cut = -1 if ct2.adds_source_eos(model_dir) else None  # (else the tokens keep their EOS)
    sym = ct2.Symbols(cfg.common_eval.path)
    prefix = ct2.target_prefix(models[0], tgt_dict)
    for k in range(workers):
        reqs, sids = [], []
        for sample in _shard_batches(dataset, n, k, workers, cfg.dataset.batch_size or 1):
            src = sample["net_input"]["src_tokens"]
            toks = [sym.to_ct2([src_dict[i] for i in utils.strip_pad(row, src_dict.pad()).tolist()[:cut]])
                    for row in src]
            reqs.append({"tokens": toks, "max_len": length_cap(gen.max_len_a, gen.max_len_b, src.size(1), max_pos),
                         "min_len": gen.min_len, "prefix": prefix and sym.to_ct2(prefix)})
            sids.append(sample["id"].tolist())
        shards.append(reqs)
        ids.append(sids)
    compute_type = ct2.COMPUTE_TYPES[mode]
    if compute_type is None:  # ct2-best: the fastest compute type at this thread count per worker
        probe = ct2.probe_batches(shards[0])
        compute_type = ct2.tune(model_dir, probe, [threads], min(args.warmup, len(probe)))["compute_type"]
    res = ct2.serve(model_dir, shards, compute_type, threads, args.warmup)
    recs = []
    for sids_k, out_k in zip(ids, res["shards"]):
        for sids, out in zip(sids_k, out_k):
            for sid, hyp in zip(sids, out["hyps"]):
                recs.append({"id": sid, "seconds": out["seconds"],
                             "tokens": [tgt_dict.index(t) for t in sym.from_ct2(hyp)] + [tgt_dict.eos()]})
    return {"wall": res["wall"], "requests": recs, "peak_rss": res.get("peak_rss"),
            "ct2_config": {"compute_type": compute_type, "threads": threads}}


def _percentile(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def run_workers(argv, bench_args) -> Dict:
    """Every ``--bench-modes`` mode served by ``--bench-workers`` workers, under ``--bench-load``."""

    workers = bench_args.bench_workers
    threads = bench_args.threads or max(1, usable_cpus() // workers)
    modes = [m.strip() for m in bench_args.bench_modes.split(",") if m.strip()]
    cfg, args, task, dataset, n = _load(argv)
    if n < workers:
        raise SystemExit(f"error: --bench-workers {workers} needs at least {workers} sentences, the subset has {n}")
    runs = {}
    with cpu_load(bench_args.bench_load):
        for m in modes:
            logger.info(f"workers: {workers} x {m} ({threads} thread(s) each)")
            try:
                runs[m] = (_run_ct2(m, cfg, args, task, dataset, n, workers, threads) if m in COMPUTE_TYPES
                           else _run_processes(argv, m, workers, threads, bench_args.bench_worker_kind))
            except (CT2Error, RuntimeError) as e:
                raise SystemExit(f"error: {e}")
    ref = {r["id"]: r["tokens"] for r in runs["greedy"]["requests"]} if "greedy" in runs else None
    out = {"sentences": n, "workers": workers, "worker_kind": bench_args.bench_worker_kind,
           "threads_per_worker": threads, "load": bench_args.bench_load,
           "batch_size": cfg.dataset.batch_size or 1, "machine": machine_info(), "modes": {}}
    for m, r in runs.items():
        lat = [1000 * q["seconds"] for q in r["requests"]]
        row = {"wall_s": r["wall"], "sentences_per_s": len(r["requests"]) / r["wall"],
               "latency_ms_p50": _percentile(lat, 0.5), "latency_ms_p95": _percentile(lat, 0.95),
               "latency_ms_mean": statistics.mean(lat), "peak_rss_mb": (r.get("peak_rss") or 0) / 2**20}
        if ref is not None:
            row["identical_to_greedy"] = sum(q["tokens"] == ref[q["id"]] for q in r["requests"])
        if "ct2_config" in r:
            row["ct2_config"] = r["ct2_config"]
        out["modes"][m] = row
        # per sentence: its output and its request's latency (to compare runs, e.g. loaded with quiet)
        out.setdefault("per_request", {})[m] = sorted(r["requests"], key=lambda q: q["id"])
    ct2_modes = [m for m in out["modes"] if m in COMPUTE_TYPES]
    if ct2_modes:  # CTranslate2's fastest mode of the run is the bar
        out["ct2_fastest"] = max(ct2_modes, key=lambda m: out["modes"][m]["sentences_per_s"])
    for base in (out.get("ct2_fastest"), "greedy-native"):
        if base in out["modes"]:
            for row in out["modes"].values():
                row[f"throughput_vs_{base}"] = row["sentences_per_s"] / out["modes"][base]["sentences_per_s"]
    return out


def print_workers_table(res, file=sys.stdout) -> None:

    print(f"machine: {describe_machine(res['machine'])}", file=file)
    kind = ("one process each" if res.get("worker_kind", "processes") == "processes"
            else "decoder threads of one process, one copy of the weights")
    print(f"{res['sentences']} sentences, {res['workers']} workers ({kind}; CTranslate2: inter_threads) "
          f"x {res['threads_per_worker']} thread(s), "
          f"batch {res['batch_size']}; {describe_load(res['load'])}", file=file)

    bases = [b for b in (res.get("ct2_fastest"), "greedy-native") if b in res["modes"]]
    cols = (["mode", "sent/s", "latency p50 ms", "latency p95 ms", "peak RSS MB"] + [f"x {b}" for b in bases]
            + ["=greedy"])
    print("| " + " | ".join(cols) + " |", file=file)
    print("|" + "---|" * len(cols), file=file)
    for m, r in res["modes"].items():
        cells = [describe_mode(m, r), f"{r['sentences_per_s']:.1f}", f"{r['latency_ms_p50']:.1f}",
                 f"{r['latency_ms_p95']:.1f}", f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "-"]
        cells += [f"{r[f'throughput_vs_{b}']:.2f}" for b in bases]
        cells.append(f"{r['identical_to_greedy']}/{res['sentences']}" if "identical_to_greedy" in r else "-")
        print("| " + " | ".join(cells) + " |", file=file)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
