"""``fairseq-aggressive-bench``: beam 5, greedy and aggressive decoding side by
side in one process on binarized data.

    fairseq-aggressive-bench DATA --path CKPT --gen-subset test \
        [--bench-modes beam5,greedy,iad] [--batch-size 1] [--threads 2] \
        [--bench-json out.json] [--bench-plot out.png]

GAD modes need ``--drafter-path DRAFTER.pt``: ``gad`` (exact), ``gad++``
(top-beta/tau: ``--gad-beta/--gad-tau`` if beta > 1, else beta 3, tau 1.0),
each optionally with a block size, e.g. ``gad@4,gad@8,gad++@8``; ``gad-bf16@8``
runs the drafter in bfloat16 where the CPU has it natively (float32 elsewhere).  Blockwise
modes (a ``transformer_blockwise`` checkpoint): ``blockwise`` (exact),
``blockwise-top3`` (top-3 acceptance), ``blockwise-min2`` (minimum block 2).

``iad@L`` is IAD with drafts of at most L tokens (``--max-draft-len L``; the
SAD paper's Lmax); ``-bN`` after an IAD mode (``iad-b3``, ``iad@1024-b3``)
verifies up to N copies after an edit in one pass (``--iad-branches N``);
``-cost`` (``iad-cost``, ``iad-b3-cost``) chooses draft lengths from the
engine's measured pass cost (``--draft-cost auto``).  For every aggressive
mode the JSON gives each sentence's passes, and the table after the main one
puts the mean passes against E, the edit spans between the source and
greedy's output (maximal runs of unmatched steps in a Levenshtein
alignment), beside the reference line 1 + 1.3E (one pass, plus 1.3 passes
per edit span) and the fewest passes any drafter that copies the source can need.

``-int8`` after any other mode (``greedy-int8``, ``iad-int8``,
``greedy-native-int8``, ``beam5-int8``) decodes a copy of the model with int8
linear layers (``--inference-precision int8``); its ``=greedy`` column counts
outputs identical to ``greedy-int8`` (the same int8 model) when that mode runs,
and ``=fp32`` those identical to float32 ``greedy`` (the quality change).

``-pyloop`` after an IAD mode or ``greedy-native`` (``iad-pyloop``,
``greedy-native-int8-pyloop``) runs the draft -> verify -> accept loop in
Python, one engine call per pass (``--python-loop``), where the engine would
run it in one call per batch: the same output, the cost of the round trips.

``-dsl`` after a gad mode (``gad@8-dsl``) drafts from the same shortlist
(``--drafter-shortlist``): cheaper drafting passes, the output still greedy's.
``-sl`` after any mode but beam and CTranslate2 (``iad-sl``, ``greedy-sl``,
``iad-int8-sl``) decodes with the vocabulary shortlist (``--vocab-shortlist``
with ``--bench-shortlist`` frequent tokens, default 1,000): an approximate
model; ``greedy-sl`` is greedy search on it and the reference of the ``=greedy``
column of the ``-sl`` modes.

CTranslate2 modes (``pip install 'fairseq-aggressive[ct2]'``): ``ct2`` and
``ct2-int8`` decode the same batches greedily with CTranslate2 (float32 and
int8 compute), converted once from the checkpoint with CTranslate2's fairseq
converter (cached as ``CKPT.ct2/``).  CTranslate2 runs in a process of its own
(in the torch process the two OpenMP runtimes slow each other down many
times), with the same thread count, after the torch modes have finished: the
same warm-up batches first, then every batch timed one by one around
``translate_batch``; the length cap is fairseq's (``--max-len-a/-b``).
``ct2-best`` first times every compute type CTranslate2 supports on the CPU at
1, 2, 4, ... threads (up to the CPUs this process may use) on the first 40
sentences, then decodes the run with the fastest (the JSON's ``ct2_config``
lists every configuration's time).  The ``x ct2...`` column compares every mode
with the fastest CTranslate2 mode of the run.

The torch modes decode every batch back to back (interleaved), so machine
noise hits them alike; then the modes on the native engine (``--engine``)
the same way in a block of their own (torch's idle OpenMP threads and the
engine's worker thread would compete for the cores if the two were
interleaved); a warm-up precedes each block, and timing covers
decoding only (data loading and model loading are excluded).  The table and
the JSON name the machine: CPU model, torch's CPU capability, native bf16,
threads, torch and fairseq versions.
"""
import argparse
import json
import re
import logging
import statistics
import sys
import time
from typing import Dict, List, Tuple

import torch

import fairseq_aggressive  # noqa: F401  (registers the task, patches loading)
from fairseq_aggressive import ct2_baseline
from fairseq_aggressive.ct2_baseline import COMPUTE_TYPES
from fairseq_aggressive.cpu_features import describe_machine, machine_info
from fairseq_aggressive.cpu_load import cpu_load
from fairseq_aggressive.evaluation.m2 import distance_table
from fairseq_aggressive.generator import length_cap
from fairseq_aggressive.options import check_isa
from fairseq_aggressive.threads import usable_cpus

logger = logging.getLogger("fairseq_aggressive.bench")

# mode -> generation-arg overrides
MODES = {
    "beam5": dict(beam=5, decoding="beam"),
    "greedy": dict(beam=1, decoding="beam"),
    "iad": dict(beam=1, decoding="iad"),
}


GADPP_DEFAULT = dict(gad_beta=3, gad_tau=1.0)  # the paper's high-quality setting
SHORTLIST_DEFAULT = 1000  # -sl modes: the 1,000 most frequent tokens + the source tokens


def mode_overrides(name: str, args) -> Dict:
    """Generation overrides for a mode name (``beam5``, ``iad``, ``gad@8``, ``gad++`` ...).
    An aggressive mode may end in ``-native`` or ``-torch`` (the verifier engine,
    default ``--engine``); ``greedy-native`` is greedy search in the native
    engine (IAD with empty drafts).  A final ``:TARGET`` runs a native mode on
    that build target of the engine (``iad:avx2``, ``greedy-native-int8:avx512``)."""
    if ":" in name:  # a native mode on one build target of the engine (iad:avx2)
        base, isa = name.rsplit(":", 1)
        ov = mode_overrides(base, args)
        if ov.get("decoding", "beam") == "beam" or ov.get("engine") == "torch" or base in COMPUTE_TYPES:
            raise SystemExit(f"benchmark mode {name}: :TARGET applies to modes on the native engine")
        try:
            return dict(ov, native_isa=check_isa(isa) or "auto")
        except ValueError as e:
            raise SystemExit(f"benchmark mode {name}: {e}")
    if name.endswith("-pyloop"):  # the generator's loop in Python where the engine would run it
        ov = mode_overrides(name[: -len("-pyloop")], args)
        if ov.get("decoding") != "iad" or ov.get("engine") == "torch":
            raise SystemExit(f"benchmark mode {name}: -pyloop applies to IAD modes and greedy-native")
        return dict(ov, python_loop=True)
    if name.endswith("-dsl"):  # GAD with the drafter shortlist (proposals only: still exact)
        ov = mode_overrides(name[: -len("-dsl")], args)
        if ov.get("decoding") != "gad":
            raise SystemExit(f"benchmark mode {name}: -dsl applies to gad modes")
        return dict(ov, drafter_shortlist=getattr(args, "bench_shortlist", None) or SHORTLIST_DEFAULT)
    if name.endswith("-sl"):  # approximate: the vocabulary shortlist (greedy-sl: greedy on it)
        base = name[: -len("-sl")]
        if base in COMPUTE_TYPES or base in ("beam5", "beam5-int8"):
            raise SystemExit(f"benchmark mode {name}: -sl applies to aggressive modes and greedy")
        ov = mode_overrides(base, args)
        if base in ("greedy", "greedy-int8"):
            ov.update(decoding="iad", max_draft_len=0)
        return dict(ov, vocab_shortlist=getattr(args, "bench_shortlist", None) or SHORTLIST_DEFAULT)
    if name.endswith("-int8") and name not in COMPUTE_TYPES:
        return dict(mode_overrides(name[: -len("-int8")], args), inference_precision="int8")
    for engine in ("native", "torch"):
        if name.endswith("-" + engine) and name != "greedy-torch":
            base = name[: -len(engine) - 1]
            ov = dict(beam=1, decoding="iad", max_draft_len=0) if base == "greedy" else mode_overrides(base, args)
            if ov.get("decoding", "beam") == "beam" or base in COMPUTE_TYPES:
                raise SystemExit(f"benchmark mode {name}: -{engine} applies to aggressive modes and greedy")
            return dict(ov, engine=engine)
    if name in MODES:
        return dict(MODES[name])
    if name in COMPUTE_TYPES:
        return {}
    m = re.fullmatch(r"iad(?:@(\d+))?(?:-b(\d+))?(-cost)?", name)
    if m:  # IAD with a draft length cap (the SAD paper's Lmax), branches after an edit, a cost budget
        ov = dict(beam=1, decoding="iad")
        if m.group(1):
            ov["max_draft_len"] = int(m.group(1))
        if m.group(2):
            ov["iad_branches"] = int(m.group(2))
        if m.group(3):
            ov["draft_cost"] = "auto"
        return ov
    m = re.fullmatch(r"blockwise(?:-top(\d+))?(?:-min(\d+))?", name)
    if m:  # blockwise, blockwise-top3, blockwise-min2, blockwise-top3-min2
        return dict(beam=1, decoding="blockwise", blockwise_topk=int(m.group(1) or 1),
                    min_block_size=int(m.group(2) or 1))
    base, _, k = name.partition("@")
    bf16 = base.endswith("-bf16")
    base = base[: -len("-bf16")] if bf16 else base
    if base not in ("gad", "gad++") or (k and not k.isdigit()):
        raise SystemExit(
            f"unknown benchmark mode {name!r}; choose from {', '.join(MODES)}, gad, gad++ "
            "(optionally with @BLOCK_SIZE, e.g. gad@8), blockwise[-topK][-minL], iad[@LMAX][-bN][-cost], ct2, "
            "ct2-int8, ct2-best; "
            "aggressive modes take -native or -torch (e.g. iad-torch), greedy-native; any mode takes "
            "a final -int8 (e.g. iad-int8), then -sl (e.g. iad-sl, greedy-sl); IAD modes and greedy-native take "
            "-pyloop (e.g. iad-pyloop)"
        )
    if not getattr(args, "drafter_path", None):
        raise SystemExit(f"benchmark mode {name} needs --drafter-path DRAFTER.pt")
    ov = dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=int(k) if k else None,
              drafter_bf16="auto" if bf16 else (getattr(args, "drafter_bf16", None) or "off"))
    if base == "gad++":
        user_beta = getattr(args, "gad_beta", 1)
        ov.update(GADPP_DEFAULT if user_beta == 1 else dict(gad_beta=user_beta, gad_tau=args.gad_tau))
    return ov


def without_target(mode: str) -> str:
    """The mode without its ``:TARGET`` (the engine's build target)."""
    return mode.rsplit(":", 1)[0]


def reference_mode(mode: str, modes) -> str:
    """The mode whose outputs ``mode`` must equal: greedy of the same model
    (int8: ``greedy-int8``; shortlist: ``greedy-sl`` / ``greedy-int8-sl``)."""
    mode = without_target(mode)
    sl = mode.endswith("-sl")
    base = mode[: -len("-sl")] if sl else mode
    int8 = base.endswith("-int8") and base not in COMPUTE_TYPES
    ref = "greedy" + ("-int8" if int8 else "") + ("-sl" if sl else "")
    return ref if ref in modes else "greedy"


def add_bench_args(parser):
    g = parser.add_argument_group("benchmark")
    g.add_argument("--bench-modes", default="beam5,greedy,iad",
                   help="comma-separated modes among: " + ", ".join(MODES) + ", gad, gad++ "
                   "(GAD with --drafter-path; gad@K sets the block size), iad@L (drafts of at most "
                   "L tokens), iad-bN (N branches after an edit), iad-cost (cost-aware draft lengths; "
                   "combine as iad@L-bN-cost), blockwise, "
                   "ct2, ct2-int8 (CTranslate2 greedy, float32 and int8, in a process of its own), ct2-best "
                   "(CTranslate2 at its fastest compute type and thread count on this machine, timed on the "
                   "first 40 sentences); "
                   "-native / -torch pick the verifier of an aggressive mode (greedy-native: the engine's "
                   "greedy); a final -int8 decodes an int8 copy of the model (iad-int8, greedy-int8); "
                   "a final -sl decodes with the vocabulary shortlist of --bench-shortlist (approximate; "
                   "greedy-sl is greedy on it)")
    g.add_argument("--bench-shortlist", type=int, default=SHORTLIST_DEFAULT,
                   help="frequent tokens of the -sl modes' shortlist (plus each sentence's source tokens)")
    g.add_argument("--threads", type=int, default=None,
                   help="threads of every engine (torch, the native engine, CTranslate2); default: each "
                   "engine's own default (the native engine: --native-threads auto; CTranslate2: the "
                   "CPUs this process may use)")
    g.add_argument("--bench-load", type=int, default=0, metavar="N",
                   help="run N CPU-bound processes beside the decoder for the whole run (every mode, "
                   "CTranslate2 included): a machine that is also doing other work")
    g.add_argument("--bench-workers", type=int, default=0, metavar="W",
                   help="instead of the table: W decoder processes per mode at once, each decoding its "
                   "share of the sentences one request at a time, as a service with W workers does "
                   "(sentences per second in total, per-request latency p50/p95; CTranslate2: one "
                   "translator with inter_threads=W); each worker gets the CPUs / W threads")
    g.add_argument("--bench-worker-kind", choices=("processes", "threads"), default="processes",
                   help="with --bench-workers: W processes, each with its own copy of the model "
                   "(processes), or one process with W decoder threads on one copy of the native "
                   "engine's weights (threads)")
    g.add_argument("--bench-max-sentences", type=int, default=None,
                   help="decode only the first N sentences of the subset")
    g.add_argument("--baseline-path", default=None,
                   help="also decode with beam 5 of this checkpoint (mode 'base_beam5', e.g. a 6+6 "
                   "model as in the papers) and report every mode's speedup over it")
    g.add_argument("--warmup", type=int, default=5, help="batches decoded before timing")
    g.add_argument("--bench-json", default=None, help="write all results as JSON here")
    g.add_argument("--bench-plot", default=None, help="write a PNG of speedup vs edit ratio here")
    g.add_argument("--bench-edit-plot", default=None,
                   help="write a PNG of passes per sentence against edit spans here")
    return parser


def edit_span_ranges(a: List[int], b: List[int], d=None) -> List[Tuple[int, int]]:
    """Per maximal run of unmatched steps (substitutions, insertions, deletions)
    in a Levenshtein alignment of ``a`` to ``b``, the range ``[start, end)`` of
    the tokens of ``b`` in it (empty for a deletion; the backtrace prefers
    matches, then substitutions).  ``d``: their table
    (:func:`~fairseq_aggressive.evaluation.m2.distance_table`), if already made."""
    n, m = len(a), len(b)
    d = distance_table(a, b) if d is None else d
    i, j, spans, in_span = n, m, [], False
    while i > 0 or j > 0:
        if i > 0 and j > 0 and a[i - 1] == b[j - 1] and d[i][j] == d[i - 1][j - 1]:
            i, j, in_span = i - 1, j - 1, False
            continue
        if not in_span:
            spans.append([j, j])
        in_span = True
        if i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + 1:
            i, j = i - 1, j - 1
        elif i > 0 and d[i][j] == d[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
        spans[-1][0] = j
    return [(s, e) for s, e in reversed(spans)]


def span_lengths(a: List[int], b: List[int], d=None) -> List[int]:
    """Per edit span (:func:`edit_span_ranges`), the tokens of ``b`` in it."""
    return [e - s for s, e in edit_span_ranges(a, b, d)]


def edit_spans(a: List[int], b: List[int]) -> int:
    """E: the maximal runs of unmatched steps in a Levenshtein alignment of ``a`` to ``b``."""
    return len(span_lengths(a, b))


def pass_bound(a: List[int], b: List[int]) -> int:
    """Fewest passes a drafter that copies ``a`` can need for output ``b``."""
    return bound_of_spans(span_lengths(a, b))


def bound_of_spans(spans: List[int]) -> int:
    """One pass, plus per edit span one per output token in it (a pass emits
    one token it did not draft), at least one (a deletion's span still ends a draft)."""
    return 1 + sum(max(1, k) for k in spans)


def gen_args_for(cfg_generation, overrides) -> argparse.Namespace:
    args = argparse.Namespace(**dict(cfg_generation))
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def run(cfg, bench) -> Dict:
    from fairseq import checkpoint_utils, tasks, utils

    if bench.threads is not None:
        torch.set_num_threads(bench.threads)
    modes = [m.strip() for m in bench.bench_modes.split(",") if m.strip()]
    overrides = {m: mode_overrides(m, bench) for m in modes}
    if bench.threads is not None:
        overrides = {m: dict(ov, native_threads=bench.threads) for m, ov in overrides.items()}
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble(utils.split_paths(cfg.common_eval.path), task=task)
    model = models[0].eval()
    ct2_modes = [m for m in modes if m in COMPUTE_TYPES]
    ct2_dir = None
    if ct2_modes:
        try:
            ct2_dir = ct2_baseline.converted_model(cfg.common_eval.path, cfg.task.data)
        except ct2_baseline.CT2Error as e:
            raise SystemExit(f"error: {e}")
    # (name, model, generation overrides) of the modes decoded in this process
    int8_model = None
    if any(ov.get("inference_precision") == "int8" for ov in overrides.values()):
        import copy

        from fairseq_aggressive.quantization import quantize_int8

        int8_model = quantize_int8(copy.deepcopy(model)).eval()
    specs = [(m, int8_model if overrides[m].get("inference_precision") == "int8" else model, overrides[m])
             for m in modes if m not in COMPUTE_TYPES]
    if bench.baseline_path:
        base, _ = checkpoint_utils.load_model_ensemble([bench.baseline_path], task=task)
        specs.insert(0, ("base_beam5", base[0].eval(), MODES["beam5"]))
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

    # modes run in blocks, one engine at a time: the torch modes interleaved batch by batch,
    # then the native-engine modes interleaved (torch's idle OpenMP threads and the native
    # engine's worker would otherwise compete for the cores), then CTranslate2 (own process)
    blocks = [[m for m in gens if getattr(gens[m][1], "native", None) is None],
              [m for m in gens if getattr(gens[m][1], "native", None) is not None]]
    per_sent = {i: {"id": i} for i in ids}
    totals = {m: 0.0 for m in modes}
    steps = {m: 0 for m in modes}  # batched decoder steps of the stock generators
    with cpu_load(bench.bench_load):
        decode_blocks(blocks, gens, batches, bench, per_sent, totals, steps, tgt_dict, src_dict, bpe)
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
    for m, config in ct2_configs.items():  # CTranslate2's compute type and threads per mode
        res["modes"][m]["ct2_config"] = config
    for m, n_ties in ties.items():
        res["modes"][m]["near_ties_with_greedy"] = n_ties
    return res


# A token that differs from greedy's is a near-tie when greedy's model gives the
# two tokens log-probabilities within float rounding's reach of each other
# (int8 models: within one activation quantization step's reach); see
# docs/exactness-and-portability.md.
NEAR_TIE = 1e-4
INT8_NEAR_TIE = 0.2


def count_near_ties(modes, per_sent, models, eos) -> Dict[str, int]:
    """Per mode with a greedy reference decoded in this process: how many of
    its outputs that differ from greedy's first differ at a near-tie."""
    out = {}
    for m in modes:
        ref = reference_mode(m, modes)
        base = without_target(m)
        int8 = base.endswith("-int8")
        if m == ref or ref not in models or base.endswith("-sl") or int8 != ref.endswith("-int8"):
            continue  # no greedy of the same arithmetic to compare with
        tol = INT8_NEAR_TIE if ref.endswith("-int8") else NEAR_TIE
        n = 0
        for rec in per_sent.values():
            a, b = rec[ref]["tokens"], rec[m]["tokens"]
            if a == b:
                continue
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if k >= min(len(a), len(b)):
                continue  # one output is a prefix of the other: no choice between two tokens
            src = torch.tensor([rec["src_tokens"]])
            with torch.no_grad():
                mdl = models[ref]
                net = mdl(src, torch.tensor([src.size(1)]), torch.tensor([[eos] + a[:k]]))
                lp = mdl.get_normalized_probs(net, log_probs=True)[0, -1]
            n += abs(float(lp[a[k]] - lp[b[k]])) < tol
        out[m] = n
    return out


def ct2_threads(bench) -> int:
    """CTranslate2's intra-op threads: ``--threads``, else the CPUs this process may use
    (ct2-best chooses its own)."""
    return bench.threads or usable_cpus()


def decode_blocks(blocks, gens, batches, bench, per_sent, totals, steps, tgt_dict, src_dict, bpe):
    """Every batch with every mode of the torch and native blocks (see the module's docstring)."""
    from fairseq import utils
    from fairseq.logging import progress_bar

    for block in [b for b in blocks if b]:
        for sample in batches[: bench.warmup]:
            for m in block:
                gens[m][1].generate([gens[m][0]], sample)
        for m in block:
            if hasattr(gens[m][1], "stats"):
                gens[m][1].stats.__init__()
        for sample in progress_bar.progress_bar(batches, log_format="tqdm", prefix="bench"):
            sids = sample["id"].tolist()
            for m in block:
                t0 = time.perf_counter()
                mdl, gen = gens[m]
                hypos = gen.generate([mdl], sample)
                dt = time.perf_counter() - t0
                totals[m] += dt
                steps[m] += max(len(h[0]["tokens"]) for h in hypos)
                passes = getattr(gen, "last_sentence_passes", None)
                for k, sid in enumerate(sids):
                    toks = hypos[k][0]["tokens"]
                    per_sent[sid][m] = {"ms": 1000 * dt / len(sids), "tokens": toks.tolist(),
                                        "text": tgt_dict.string(toks, bpe)}
                    if passes is not None:
                        per_sent[sid][m]["passes"] = passes[k]
            for k, sid in enumerate(sids):
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
    for sample in batches:
        src = sample["net_input"]["src_tokens"]
        max_len = length_cap(gen.max_len_a, gen.max_len_b, src.size(1), max_pos)
        toks = [[src_dict[i] for i in utils.strip_pad(row, src_dict.pad()).tolist()[:-1]] for row in src]
        requests.append({"tokens": toks, "max_len": max_len})
    compute_type, threads, config = COMPUTE_TYPES[mode], ct2_threads(bench), None
    try:
        if compute_type is None:  # ct2-best: the fastest configuration on the first sentences
            probe = ct2_baseline.probe_batches(requests)
            counts = ct2_baseline.thread_counts(max(ct2_threads(bench), usable_cpus()))
            config = ct2_baseline.tune(model_dir, probe, counts, min(bench.warmup, len(probe)))
            compute_type, threads = config["compute_type"], config["threads"]
            logger.info(f"{mode}: {compute_type}, {threads} thread(s) was the fastest of "
                        + ", ".join(f"{c['compute_type']}/{c['threads']}t {1000 * c['seconds']:.0f} ms"
                                    for c in config["configs"])
                        + f" on the first {sum(len(b['tokens']) for b in probe)} sentences")
        res = ct2_baseline.decode(model_dir, requests, compute_type, threads, bench.warmup)
    except ct2_baseline.CT2Error as e:
        raise SystemExit(f"error: {e}")
    bpe = cfg.common_eval.post_process
    for sample, out in zip(batches, res["batches"]):
        sids = sample["id"].tolist()
        totals[mode] += out["seconds"]
        steps[mode] += 1 + max(len(h) for h in out["hyps"])
        for sid, hyp in zip(sids, out["hyps"]):
            ids = [tgt_dict.index(t) for t in hyp] + [tgt_dict.eos()]
            per_sent[sid][mode] = {"ms": 1000 * out["seconds"] / len(sids), "tokens": ids,
                                   "text": tgt_dict.string(torch.tensor(ids), bpe)}
    logger.info(f"{mode}: CTranslate2 {res['version']}, {model_dir}")
    return dict(config or {}, compute_type=compute_type, threads=threads)


def summarize(modes, per_sent, totals, steps, gens, bsz, threads, load=0) -> Dict:
    import sacrebleu

    recs = [per_sent[i] for i in sorted(per_sent)]
    has_ref = all("ref_text" in r for r in recs)
    out = {"sentences": len(recs), "batch_size": bsz, "threads": threads, "load": load,
           "machine": machine_info(), "modes": {}}
    ct2_modes = [m for m in modes if m in COMPUTE_TYPES]
    ct2_best = min(ct2_modes, key=lambda m: totals[m]) if ct2_modes else None
    if ct2_best:
        out["ct2_fastest"] = ct2_best
    for m in modes:
        row = {
            "total_s": totals[m],
            "mean_ms_per_sentence": 1000 * totals[m] / max(len(recs), 1),
            "median_ms_per_sentence": statistics.median(r[m]["ms"] for r in recs) if recs else 0,
        }
        for base in ("base_beam5", "beam5", "greedy", "greedy-native"):
            if base in modes:
                row[f"speedup_vs_{base}"] = totals[base] / totals[m] if totals[m] else float("nan")
        if ct2_best:  # CTranslate2's fastest mode of this run (float32 or int8)
            row["speedup_vs_ct2"] = totals[ct2_best] / totals[m] if totals[m] else float("nan")
        gen = gens[m][1] if m in gens else None
        if hasattr(gen, "stats"):
            st = gen.stats.as_dict()
            row["decoder_passes"] = st["sentence_passes"]
            row["batched_passes"] = st["passes"]
            row["mean_tokens_per_pass"] = st["mean_tokens_per_pass"]
            row["mean_passes_per_sentence"] = st["mean_passes_per_sentence"]
            row["drafted"], row["accepted"] = st["drafted"], st["accepted"]
            row["draft_time_share"] = st["draft_seconds"] / totals[m] if totals[m] else 0.0
            row["wasted_per_pass"] = st["wasted_per_pass"]
            row["tree_passes"], row["branch_wins"] = st["tree_passes"], st["branch_wins"]
            if st["acceptance_by_position"]:  # per draft position: the share of drafts reaching it accepted there
                row["acceptance_by_position"] = st["acceptance_by_position"]
            if getattr(gen, "native", None) is not None:  # where the engine's threads spent their time
                row["pool"] = gen.native.pool_stats()
                row["native_target"] = gen.native.isa
            wins = getattr(gen.drafter, "wins", None)
            if wins:
                row["kept_branch_kinds"] = dict(wins)
        else:
            n_steps = sum(len(r[m]["tokens"]) for r in recs)  # one step per output token
            row["decoder_passes"] = n_steps
            row["batched_passes"] = steps[m]
            row["mean_tokens_per_pass"] = 1.0
            row["mean_passes_per_sentence"] = n_steps / max(len(recs), 1)
        ref = reference_mode(m, modes)
        if ref in modes:  # greedy of the same model (an int8 mode's: greedy-int8; a -sl mode's: greedy-sl)
            row["identical_to_greedy"] = sum(r[m]["tokens"] == r[ref]["tokens"] for r in recs)
        if "greedy" in modes:  # greedy of the float32 model
            row["identical_to_fp32_greedy"] = sum(r[m]["tokens"] == r["greedy"]["tokens"] for r in recs)
        if has_ref:
            hyps = [r[m]["text"] for r in recs]
            refs = [r["ref_text"] for r in recs]
            row["bleu"] = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score
            row["exact_match"] = sum(h == r for h, r in zip(hyps, refs)) / max(len(recs), 1)
        out["modes"][m] = row
    out["passes_by_edit_spans"] = passes_by_edit_spans(modes, recs)
    out["per_sentence"] = recs
    return out


EDIT_BUCKETS = [0, 1, 2, 3, 4, 5]  # E = 0 .. 4, then 5 or more


def passes_by_edit_spans(modes, recs) -> Dict:
    """Per mode with per-sentence passes: mean passes by E (edit spans), the
    sentences' mean of the reference line 1 + 1.3E, and the fit of passes =
    a + b*E (least squares: b is the passes one edit span costs)."""
    out = {}
    for m in modes:
        pts = [(r["edit_spans"], r[m]["passes"]) for r in recs if "passes" in r.get(m, {})]
        bound = [r["pass_bound"] for r in recs if "passes" in r.get(m, {})]
        if not pts:
            continue
        buckets = {}
        for lo, hi in zip(EDIT_BUCKETS, EDIT_BUCKETS[1:] + [10 ** 9]):
            sel = [p for e, p in pts if lo <= e < hi]
            if sel:
                sb = [bd for (e, _), bd in zip(pts, bound) if lo <= e < hi]
                se = [e for e, _ in pts if lo <= e < hi]
                buckets[f"{lo}+" if hi == 10 ** 9 else str(lo)] = {
                    "sentences": len(sel), "mean_passes": statistics.mean(sel), "mean_bound": statistics.mean(sb),
                    "reference_passes": 1 + 1.3 * statistics.mean(se)}
        es = [e for e, _ in pts]
        ps = [p for _, p in pts]
        me, mp = statistics.mean(es), statistics.mean(ps)
        var = sum((e - me) ** 2 for e in es)
        slope = sum((e - me) * (p - mp) for e, p in pts) / var if var else float("nan")
        out[m] = {"buckets": buckets, "mean_passes": mp, "mean_edit_spans": me, "mean_bound": statistics.mean(bound),
                  "reference_passes": 1 + 1.3 * me, "passes_per_span": slope, "intercept": mp - slope * me}
    return out


def print_edit_table(res, file=sys.stdout):
    """Mean passes per sentence against E, the edit spans between source and
    greedy output, with the reference line 1 + 1.3E (one pass, plus 1.3 per
    edit span) and the fewest passes any drafter that
    copies the source can need (one per output token inside a span)."""
    pe = res.get("passes_by_edit_spans") or {}
    modes = [m for m in pe if m in res["modes"]]
    if not modes:
        return
    keys = []
    for m in modes:
        keys += [k for k in pe[m]["buckets"] if k not in keys]
    first = pe[modes[0]]["buckets"]
    print("\npasses per sentence against E, the edit spans between source and greedy's output", file=file)
    print("| mode | " + " | ".join(f"E={k} ({first[k]['sentences']})" if k in first else f"E={k}" for k in keys)
          + " | all | passes per span | waste/pass | kept a later branch |", file=file)
    print("|" + "---|" * (len(keys) + 5), file=file)
    ref = pe[modes[0]]
    for label, key, total in (("reference 1+1.3E", "reference_passes", ref["reference_passes"]),
                              ("bound (copying)", "mean_bound", ref["mean_bound"])):
        cells = [f"{first[k][key]:.2f}" if k in first else "-" for k in keys]
        print(f"| {label} | " + " | ".join(cells) + f" | {total:.2f} | - | - | - |", file=file)
    for m in modes:
        b, row = pe[m]["buckets"], res["modes"][m]
        cells = [f"{b[k]['mean_passes']:.2f}" if k in b else "-" for k in keys]
        trees = row.get("tree_passes", 0)
        print(f"| {m} | " + " | ".join(cells) + f" | {pe[m]['mean_passes']:.2f} | "
              f"{pe[m]['passes_per_span']:.2f} | {row.get('wasted_per_pass', 0):.2f} | "
              + (f"{row.get('branch_wins', 0)}/{trees}" if trees else "-") + " |", file=file)


def print_position_table(res, file=sys.stdout, positions=8):
    """Per draft position, the share of the drafts that reached it whose token
    there was accepted (the evidence behind a draft cap)."""
    rows = [(m, r["acceptance_by_position"]) for m, r in res["modes"].items() if r.get("acceptance_by_position")]
    if not rows:
        return
    n = min(positions, max(len(a) for _, a in rows))
    print("\ndrafted tokens accepted, by position in the draft (of the drafts that reached it)", file=file)
    print("| mode | " + " | ".join(str(i + 1) for i in range(n)) + " |", file=file)
    print("|" + "---|" * (n + 1), file=file)
    for m, a in rows:
        print(f"| {m} | " + " | ".join(f"{a[i]:.2f}" if i < len(a) else "-" for i in range(n)) + " |", file=file)


def plot_edit_spans(res, path):
    """Mean passes against E for every mode with per-sentence passes, and the reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = res.get("passes_by_edit_spans") or {}
    fig, ax = plt.subplots(figsize=(6, 4))
    xs_all = set()
    for m, d in pe.items():
        xs = [int(k.rstrip("+")) for k in d["buckets"]]
        ys = [v["mean_passes"] for v in d["buckets"].values()]
        xs_all.update(xs)
        ax.plot(xs, ys, "-o", label=m)
    if xs_all:
        xs = sorted(xs_all)
        ax.plot(xs, [1 + 1.3 * x for x in xs], "k--", label="reference 1 + 1.3E (1 pass + 1.3 per edit span)")
    ax.set_xlabel("E: edit spans between source and greedy output (last bucket: 5 or more)")
    ax.set_ylabel("mean decoder passes per sentence")
    ax.set_title(f"passes against edits ({res['sentences']} sentences, batch {res['batch_size']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def describe_threads(threads) -> str:
    """``threads`` of a result (a count, or per engine) in words."""
    if not isinstance(threads, dict):
        return str(threads)
    parts = [f"torch {threads['torch']}"]
    if threads.get("engine"):
        parts.append("native engine " + "/".join(str(t) for t in threads["engine"]))
    if threads.get("ctranslate2"):
        parts.append(f"CTranslate2 {threads['ctranslate2']}")
    return ", ".join(parts)


def describe_load(load: int) -> str:
    return f"load: {load} CPU-bound process{'es' if load != 1 else ''} beside it" if load else "no load beside it"


def describe_mode(mode: str, row: Dict) -> str:
    """A mode's name in the table; ct2-best with the configuration it chose."""
    config = row.get("ct2_config")
    if mode != ct2_baseline.BEST or not config:
        return mode
    return f"{mode} ({config['compute_type']}, {config['threads']} thread{'s' if config['threads'] > 1 else ''})"


def print_table(res, file=sys.stdout):
    has_base = "base_beam5" in res["modes"]
    has_int8 = any(without_target(m).endswith(("-int8", "-sl")) for m in res["modes"])
    has_native = "greedy-native" in res["modes"]
    ct2 = res.get("ct2_fastest")
    cols = ["mode", "total_s", "ms/sent"] + (["x base beam5"] if has_base else []) + ["x beam5", "x greedy"] + (
        ["x greedy-native"] if has_native else []) + ([f"x {ct2}"] if ct2 else []) + ["passes/sent", "ms/pass", "tok/pass", "draft time", "=greedy"] + (["=fp32"] if has_int8 else []) + ["BLEU", "exact"]
    print(f"machine: {describe_machine(res['machine'])}", file=file)
    print(f"{res['sentences']} sentences, batch {res['batch_size']}, threads: {describe_threads(res['threads'])}; "
          f"{describe_load(res.get('load', 0))}", file=file)
    print("| " + " | ".join(cols) + " |", file=file)
    print("|" + "---|" * len(cols), file=file)
    for m, r in res["modes"].items():
        cells = [
            describe_mode(m, r), f"{r['total_s']:.2f}", f"{r['mean_ms_per_sentence']:.1f}",
        ] + ([f"{r['speedup_vs_base_beam5']:.2f}"] if has_base else []) + [
            f"{r['speedup_vs_beam5']:.2f}" if "speedup_vs_beam5" in r else "-",
            f"{r['speedup_vs_greedy']:.2f}" if "speedup_vs_greedy" in r else "-",
        ] + ([f"{r['speedup_vs_greedy-native']:.2f}"] if has_native else []) + (
            [f"{r['speedup_vs_ct2']:.2f}"] if ct2 else []) + [
            f"{r['mean_passes_per_sentence']:.2f}",
            f"{r['mean_ms_per_sentence'] / r['mean_passes_per_sentence']:.2f}" if r["mean_passes_per_sentence"] else "-",
            f"{r['mean_tokens_per_pass']:.2f}",
            f"{100 * r['draft_time_share']:.0f}%" if "draft_time_share" in r else "-",
            f"{r.get('identical_to_greedy', '-')}/{res['sentences']}"
            + (f" (+{r['near_ties_with_greedy']} ties)" if r.get("near_ties_with_greedy") else ""),
        ] + ([f"{r.get('identical_to_fp32_greedy', '-')}/{res['sentences']}"] if has_int8 else []) + [
            f"{r['bleu']:.2f}" if "bleu" in r else "-",
            f"{100 * r['exact_match']:.1f}%" if "exact_match" in r else "-",
        ]
        print("| " + " | ".join(cells) + " |", file=file)


def plot(res, path, mode="iad", base="beam5"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in res["per_sentence"] if mode in r and base in r]
    xs = [r["edit_ratio"] for r in recs]
    ys = [r[base]["ms"] / max(r[mode]["ms"], 1e-9) for r in recs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(xs, ys, s=8, alpha=0.4, label="sentences")
    bins = [0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, float("inf")]
    mids, means = [], []
    for lo, hi in zip(bins, bins[1:]):
        sel = [y for x, y in zip(xs, ys) if lo <= x < hi]
        if sel:
            mids.append(statistics.mean(x for x in xs if lo <= x < hi))
            means.append(statistics.mean(sel))
    ax.plot(mids, means, "r-o", label="binned mean")
    ax.set_xlabel("edit ratio (edit distance source -> output / source length)")
    ax.set_ylabel(f"speedup of {mode} over {base}")
    ax.set_title(f"{mode} speedup vs edit ratio (threads: {describe_threads(res['threads'])}, "
                 f"batch {res['batch_size']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    from fairseq import options

    parser = options.get_generation_parser(default_task="aggressive_translation")
    add_bench_args(parser)
    args = options.parse_args_and_arch(parser, input_args=argv)
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(args)
    if cfg.common_eval.path is None:
        parser.error("--path CHECKPOINT is required")
    if args.bench_load < 0 or args.bench_workers < 0:
        parser.error("--bench-load and --bench-workers must be >= 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.bench_workers:
        from fairseq_aggressive.bench_workers import print_workers_table, run_workers

        res = run_workers(sys.argv[1:] if argv is None else list(argv), args)
        print_workers_table(res)
        if args.bench_json:
            with open(args.bench_json, "w") as f:
                json.dump(res, f, indent=1)
        return res
    res = run(cfg, args)
    print_table(res)
    print_edit_table(res)
    print_position_table(res)
    if args.bench_json:
        with open(args.bench_json, "w") as f:
            json.dump(res, f, indent=1)
    if args.bench_plot and "iad" in res["modes"]:
        plot(res, args.bench_plot, base="beam5" if "beam5" in res["modes"] else "greedy")
    if args.bench_edit_plot and res.get("passes_by_edit_spans"):
        plot_edit_spans(res, args.bench_edit_plot)
    return res


def cli_main(argv=None):
    main(argv)  # console-script wrapper: exit status 0, not the result dict


if __name__ == "__main__":
    cli_main()
