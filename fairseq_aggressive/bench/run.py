"""One benchmark run in this process: every mode decodes the same batches,
the torch modes interleaved batch by batch, then the native-engine modes,
then CTranslate2 in a process of its own (see :mod:`fairseq_aggressive.bench.cli`);
near-ties against greedy are counted, then :func:`~fairseq_aggressive.bench.report.summarize`
makes the result."""
import argparse
import logging
import time
from typing import Dict

import torch

import fairseq_aggressive  # noqa: F401  (registers the task, patches loading)
from ..evaluation.edit_spans import bound_of_spans, span_lengths
from ..evaluation.m2 import distance_table
from ..generator import length_cap
from ..runtime.threads import usable_cpus
from . import ct2
from .ct2 import COMPUTE_TYPES
from .load import cpu_load
from .modes import MODES, mode_overrides, reference_mode, verifier_mode
from .report import summarize


logger = logging.getLogger("fairseq_aggressive.bench")


def gen_args_for(cfg_generation, overrides) -> argparse.Namespace:
    args = argparse.Namespace(**dict(cfg_generation))
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def run(cfg, bench) -> Dict:
    from fairseq import checkpoint_utils, tasks, utils

    torch.set_num_threads(torch_threads(bench))
    modes = [m.strip() for m in bench.bench_modes.split(",") if m.strip()]
    overrides = {m: mode_overrides(m, bench) for m in modes}
    if bench.threads is not None:
        overrides = {m: dict(ov, native_threads=bench.threads) for m, ov in overrides.items()}
    device = bench_device(bench, cfg, overrides)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble(utils.split_paths(cfg.common_eval.path), task=task)
    model = on_device(models[0].eval(), device, cfg)
    ct2_modes = [m for m in modes if m in COMPUTE_TYPES]
    ct2_dir = None
    if ct2_modes:
        try:
            ct2_dir = ct2.converted_model(cfg.common_eval.path, cfg.task.data)
        except ct2.CT2Error as e:
            raise SystemExit(f"error: {e}")
    # (name, model, generation overrides) of the modes decoded in this process
    int8_model = None
    if any(ov.get("inference_precision") == "int8" for ov in overrides.values()):
        import copy

        from fairseq_aggressive.runtime.quantization import quantize_int8

        int8_model = quantize_int8(copy.deepcopy(model)).eval()
    specs = [(m, int8_model if overrides[m].get("inference_precision") == "int8" else model, overrides[m])
             for m in modes if m not in COMPUTE_TYPES]
    if bench.baseline_path:
        base, _ = checkpoint_utils.load_model_ensemble([bench.baseline_path], task=task)
        specs.insert(0, ("base_beam5", on_device(base[0].eval(), device, cfg), MODES["beam5"]))
        modes = ["base_beam5"] + modes
    task.load_dataset(cfg.dataset.gen_subset)
    dataset = task.dataset(cfg.dataset.gen_subset)
    n = len(dataset) if bench.bench_max_sentences is None else min(len(dataset), bench.bench_max_sentences)
    bsz = cfg.dataset.batch_size or 1
    tgt_dict, src_dict = task.target_dictionary, task.source_dictionary
    bpe = cfg.common_eval.post_process

    gens = {m: (mdl, task.build_generator([mdl], gen_args_for(cfg.generation, ov))) for m, mdl, ov in specs}
    ids = list(range(n))
    if bsz > 1:  # batch similar lengths together, as fairseq-generate does
        ids.sort(key=lambda i: dataset.src_sizes[i])
    batches = [dataset.collater([dataset[i] for i in ids[j : j + bsz]]) for j in range(0, n, bsz)]
    if device.type == "cuda":
        batches = [utils.move_to_cuda(b, device) for b in batches]

    # modes run in blocks, one engine at a time: the torch modes interleaved batch by batch,
    # then the native-engine modes interleaved (torch's idle OpenMP threads and the native
    # engine's worker would otherwise compete for the cores), then CTranslate2 (own process)
    streams = [m for m in gens if overrides.get(m, {}).get("bench_stream")]
    blocks = [[m for m in gens if getattr(gens[m][1], "native", None) is None and m not in streams],
              [m for m in gens if getattr(gens[m][1], "native", None) is not None and m not in streams]]
    per_sent = {i: {"id": i} for i in ids}
    totals = {m: 0.0 for m in modes}
    steps = {m: 0 for m in modes}  # batched decoder steps of the stock generators
    with cpu_load(bench.bench_load):
        decode_blocks(blocks, gens, batches, bench, per_sent, totals, steps, tgt_dict, src_dict, bpe)
        if streams:
            from .stream import decode_streams

            if not any(blocks):  # (the batch modes record each sentence's source)
                for sample in batches:
                    record_sources(sample, per_sent, tgt_dict, src_dict, bpe)

            costs = {m: getattr(gen_args_for(cfg.generation, overrides[m]), "draft_cost", None) for m in streams}
            decode_streams(streams, gens, costs, batches, bench, per_sent, totals, bsz, src_dict.pad(), tgt_dict, bpe)
        ct2_configs = {m: run_ct2(m, ct2_dir, batches, cfg, model, src_dict, tgt_dict, bench, per_sent, totals,
                                  steps) for m in ct2_modes}
    ties = count_near_ties(modes, per_sent, {m: mdl for m, (mdl, _) in gens.items()}, tgt_dict.eos())
    for rec in per_sent.values():
        base = rec.get("greedy", rec[modes[0]])["tokens"]
        src = rec.pop("src_tokens")
        d = distance_table(src, base)  # one alignment: the edit ratio, the spans and the bound
        rec["edit_ratio"] = d[-1][-1] / max(len(src), 1)
        spans = span_lengths(src, base, d)
        rec["edit_spans"], rec["pass_bound"] = len(spans), bound_of_spans(spans)
    threads = {"torch": torch.get_num_threads(),
               "engine": sorted({g.native.threads for _, g in gens.values() if getattr(g, "native", None)}),
               "ctranslate2": ct2_threads(bench) if ct2_modes else None}
    res = summarize(modes, per_sent, totals, steps, gens, bsz, threads, bench.bench_load)
    res["rounds"] = max(1, getattr(bench, "bench_rounds", 1))
    if device.type == "cuda":
        res["device"] = {"name": torch.cuda.get_device_name(device), "dtype": str(next(model.parameters()).dtype),
                         "cuda": torch.version.cuda}
    for m, config in ct2_configs.items():  # CTranslate2's compute type and threads per mode
        res["modes"][m]["ct2_config"] = config
    for m, n_ties in ties.items():
        res["modes"][m]["near_ties_with_greedy"] = n_ties
    return res


def bench_device(bench, cfg, overrides) -> torch.device:
    """Where the run's torch modes decode (``--bench-device``); refuses what cannot run there."""
    device = getattr(bench, "bench_device", "cpu")
    fp16 = bool(getattr(cfg.common, "fp16", False))
    if device == "cpu":
        if fp16:
            raise SystemExit("error: --fp16 decodes a float16 copy on the GPU: add --bench-device cuda")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit(f"error: --bench-device cuda: torch {torch.__version__} sees no CUDA device here")
    cpu_only = [m for m, ov in overrides.items()
                if m in COMPUTE_TYPES or ov.get("engine") == "native" or ov.get("inference_precision") == "int8"
                or ov.get("native_isa") or ov.get("drafter_precision") == "int8"]
    if cpu_only:
        raise SystemExit(f"error: --bench-device cuda: {', '.join(cpu_only)} run on the CPU only (the native "
                         "engine, int8 copies and CTranslate2); run them in a CPU benchmark")
    return torch.device("cuda", torch.cuda.current_device())


def on_device(model, device, cfg):
    """``model`` where the run decodes, in float16 with ``--fp16``."""
    model = model.to(device)
    return model.half() if device.type == "cuda" and getattr(cfg.common, "fp16", False) else model


def synchronize(device) -> None:
    """Wait for the device's queued work, so that a timer read after it covers that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A token that differs from greedy's is a near-tie when greedy's model gives the
# two tokens log-probabilities within float rounding's reach of each other
# (int8 models: within one activation quantization step's reach); see
# docs/exactness-and-portability.md.
NEAR_TIE = 1e-4


INT8_NEAR_TIE = 0.2


# float16 models (--fp16 on a GPU): the log-probabilities of a pass over several positions and of
# a one-token step come from different kernels, each rounding its outputs to float16 (a relative
# step of 2^-11, about 0.01 on a logit of 20)
HALF_NEAR_TIE = 0.05


def count_near_ties(modes, per_sent, models, eos) -> Dict[str, int]:
    """Per mode with a greedy reference decoded in this process: how many of
    its outputs that differ from greedy's first differ at a near-tie."""
    out = {}
    for m in modes:
        ref = reference_mode(m, modes)
        base = verifier_mode(m)  # the verifier's model decides which greedy it must equal
        int8 = base.endswith("-int8")
        if m == ref or ref not in models or base.endswith("-sl") or int8 != ref.endswith("-int8"):
            continue  # no greedy of the same arithmetic to compare with
        mdl = models[ref]
        param = next(mdl.parameters())
        dev = param.device
        tol = INT8_NEAR_TIE if ref.endswith("-int8") else HALF_NEAR_TIE if param.dtype == torch.float16 else NEAR_TIE
        n = 0
        for rec in per_sent.values():
            a, b = rec[ref]["tokens"], rec[m]["tokens"]
            if a == b:
                continue
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if k >= min(len(a), len(b)):
                continue  # one output is a prefix of the other: no choice between two tokens
            src = torch.tensor([rec["src_tokens"]], device=dev)
            with torch.no_grad():
                net = mdl(src, torch.tensor([src.size(1)], device=dev), torch.tensor([[eos] + a[:k]], device=dev))
                lp = mdl.get_normalized_probs(net, log_probs=True)[0, -1]
            n += abs(float(lp[a[k]] - lp[b[k]])) < tol
        out[m] = n
    return out


def torch_threads(bench) -> int:
    """torch's threads for the torch modes: ``--threads``, else torch's own,
    at most the CPUs this process may use less the ``--bench-load`` processes
    (at least one).  torch's OpenMP threads meet at the end of every operation,
    so one that waits for a core behind a busy process stalls the others
    (docs/threads-and-load.md)."""
    own = torch.get_num_threads()
    if bench.threads is not None:
        return bench.threads
    return min(own, max(1, usable_cpus() - bench.bench_load)) if bench.bench_load else own


def ct2_threads(bench) -> int:
    """CTranslate2's intra-op threads: ``--threads``, else the CPUs this process may use
    (ct2-best chooses its own)."""
    return bench.threads or usable_cpus()


def decode_blocks(blocks, gens, batches, bench, per_sent, totals, steps, tgt_dict, src_dict, bpe):
    """Every batch with every mode of the torch and native blocks (see the module's docstring)."""
    from fairseq.logging import progress_bar

    rounds = max(1, getattr(bench, "bench_rounds", 1))
    for block in [b for b in blocks if b]:
        for sample in batches[: bench.warmup]:
            for m in block:
                gens[m][1].generate([gens[m][0]], sample)
        for r in range(rounds):
            # the counters count the timed batches of the last round (the times are the rounds' mean)
            for m in block:
                if hasattr(gens[m][1], "stats"):
                    gens[m][1].stats.__init__()
                if getattr(gens[m][1], "totals", None):
                    gens[m][1].totals.clear()
            for j, sample in enumerate(progress_bar.progress_bar(batches, log_format="tqdm", prefix="bench")):
                decode_batch(rotated(block, j + r), gens, sample, rounds, r == 0, per_sent, totals, steps,
                             tgt_dict, bpe)
                if r == 0:
                    record_sources(sample, per_sent, tgt_dict, src_dict, bpe)


def rotated(block, k):
    """``block`` turned by k places: every mode runs first as often as any other."""
    k %= len(block)
    return block[k:] + block[:k]


def decode_batch(order, gens, sample, rounds, first, per_sent, totals, steps, tgt_dict, bpe):
    """One batch with every mode of ``order``, in that order; a round after the first must repeat its outputs."""
    sids = sample["id"].tolist()
    device = sample["net_input"]["src_tokens"].device
    for m in order:
        synchronize(device)
        t0 = time.perf_counter()
        mdl, gen = gens[m]
        hypos = gen.generate([mdl], sample)
        synchronize(device)
        dt = (time.perf_counter() - t0) / rounds
        totals[m] += dt
        passes = getattr(gen, "last_sentence_passes", None)
        if first:
            steps[m] += max(len(h[0]["tokens"]) for h in hypos)
        for k, sid in enumerate(sids):
            toks = hypos[k][0]["tokens"].tolist()
            if not first:
                if toks != per_sent[sid][m]["tokens"]:
                    raise SystemExit(f"error: {m} decoded sentence {sid} differently in a later round")
                per_sent[sid][m]["ms"] += 1000 * dt / len(sids)
                continue
            per_sent[sid][m] = {"ms": 1000 * dt / len(sids), "tokens": toks,
                                "text": tgt_dict.string(hypos[k][0]["tokens"], bpe)}
            if passes is not None:
                per_sent[sid][m]["passes"] = passes[k]


def record_sources(sample, per_sent, tgt_dict, src_dict, bpe):
    """Each sentence's source (text and tokens) and reference beside its outputs."""
    from fairseq import utils

    for k, sid in enumerate(sample["id"].tolist()):
        rec = per_sent[sid]
        src = utils.strip_pad(sample["net_input"]["src_tokens"][k], src_dict.pad()).tolist()
        rec["src_text"] = src_dict.string(torch.tensor(src), bpe)
        rec["src_tokens"] = src
        if sample.get("target") is not None:
            ref = utils.strip_pad(sample["target"][k], tgt_dict.pad())
            rec["ref_text"] = tgt_dict.string(ref, bpe)


def run_ct2(mode, model_dir, batches, cfg, model, src_dict, tgt_dict, bench, per_sent, totals, steps):
    """Decode the bench's batches with CTranslate2 in its own process; record
    them like the torch modes (token ids with the final EOS, ms per sentence)."""
    from fairseq import utils

    max_pos = model.max_decoder_positions()
    gen = cfg.generation
    requests = []
    cut = -1 if ct2.adds_source_eos(model_dir) else None  # (else the tokens keep their EOS)
    sym = ct2.Symbols(cfg.common_eval.path)
    prefix = ct2.target_prefix(model, tgt_dict)
    for sample in batches:
        src = sample["net_input"]["src_tokens"]
        max_len = length_cap(gen.max_len_a, gen.max_len_b, src.size(1), max_pos)
        toks = [sym.to_ct2([src_dict[i] for i in utils.strip_pad(row, src_dict.pad()).tolist()[:cut]])
                for row in src]
        requests.append({"tokens": toks, "max_len": max_len, "beam": ct2.beam_of(mode), "min_len": gen.min_len,
                         "prefix": prefix and sym.to_ct2(prefix)})
    compute_type, threads, workers, config = COMPUTE_TYPES[mode], ct2_threads(bench), 1, None
    rounds = max(1, getattr(bench, "bench_rounds", 1))
    try:
        if compute_type is None:  # ct2-best: the fastest configuration on the first sentences
            probe = ct2.probe_batches(requests)
            counts = ct2.thread_counts(max(ct2_threads(bench), usable_cpus()))
            config = ct2.tune(model_dir, probe, counts, min(bench.warmup, len(probe)), workers=max(counts))
            compute_type, threads, workers = config["compute_type"], config["threads"], config["workers"]
            logger.info(f"{mode}: {ct2.describe_config(compute_type, threads, workers)} was the fastest of "
                        + ", ".join(f"{ct2.describe_config(c['compute_type'], c['threads'], c['workers'])} "
                                    f"{1000 * c['seconds']:.0f} ms" for c in config["configs"])
                        + f" on the first {sum(len(b['tokens']) for b in probe)} sentences")
        res = ct2.decode(model_dir, requests * rounds, compute_type, threads, bench.warmup, workers)
    except ct2.CT2Error as e:
        raise SystemExit(f"error: {e}")
    bpe = cfg.common_eval.post_process
    n = len(batches)
    for j, (sample, out) in enumerate(zip(batches, res["batches"])):
        sids = sample["id"].tolist()
        totals[mode] += sum(res["batches"][j + r * n]["seconds"] for r in range(rounds)) / rounds
        steps[mode] += 1 + max(len(h) for h in out["hyps"])
        for sid, hyp in zip(sids, out["hyps"]):
            ids = [tgt_dict.index(t) for t in sym.from_ct2(hyp)] + [tgt_dict.eos()]
            per_sent[sid][mode] = {"ms": 1000 * out["seconds"] / len(sids), "tokens": ids,
                                   "text": tgt_dict.string(torch.tensor(ids), bpe)}
    logger.info(f"{mode}: CTranslate2 {res['version']}, {model_dir}")
    return dict(config or {}, compute_type=compute_type, threads=threads, workers=workers)
