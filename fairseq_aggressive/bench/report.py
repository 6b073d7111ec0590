"""A run's result (:func:`summarize`: the JSON's schema) and how it is shown:
the main table, passes against edit spans, acceptance by draft position, plots."""
import re
import statistics
import sys
import textwrap
from typing import Dict, List

from ..native.machine import describe_machine, machine_info
from . import ct2
from .ct2 import COMPUTE_TYPES
from .modes import reference_mode, without_target


def summarize(modes, per_sent, totals, steps, gens, bsz, threads, load=0) -> Dict:
    import sacrebleu

    recs = [per_sent[i] for i in sorted(per_sent)]
    has_ref = all("ref_text" in r for r in recs)
    out = {"sentences": len(recs), "batch_size": bsz, "threads": threads, "load": load,
           "machine": machine_info(), "modes": {}}
    ct2_modes = [m for m in modes if m in COMPUTE_TYPES]
    greedy_ct2 = [m for m in ct2_modes if ct2.beam_of(m) == 1] or ct2_modes
    ct2_best = min(greedy_ct2, key=lambda m: totals[m]) if ct2_modes else None
    # per beam width, CTranslate2's fastest beam search of the run
    ct2_beams = {}
    for m in ct2_modes:
        k = ct2.beam_of(m)
        if k > 1 and (k not in ct2_beams or totals[m] < totals[ct2_beams[k]]):
            ct2_beams[k] = m
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
        if ct2_best:  # CTranslate2's fastest greedy mode of this run (float32 or int8)
            row["speedup_vs_ct2"] = totals[ct2_best] / totals[m] if totals[m] else float("nan")
        width = beam_width(m)
        if width in ct2_beams:  # CTranslate2's fastest beam search of the same width
            row["speedup_vs_ct2_beam"] = totals[ct2_beams[width]] / totals[m] if totals[m] else float("nan")
            row["ct2_beam_reference"] = ct2_beams[width]
        gen = gens[m][1] if m in gens else None
        if getattr(gen, "totals", None):  # the engine's beam search: its steps, passes, drafted reads
            row["beam_counts"] = dict(gen.totals)
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
        elif getattr(gen, "totals", None):  # a sentence's step without a pass of its hypotheses was drafted
            c = gen.totals
            row["decoder_passes"] = c["steps"] - c["replayed"]
            row["batched_passes"] = c["passes"]
            row["mean_tokens_per_pass"] = c["steps"] / max(row["decoder_passes"], 1)
            row["mean_passes_per_sentence"] = row["decoder_passes"] / max(len(recs), 1)
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
    ratios = [r["edit_ratio"] for r in recs if "edit_ratio" in r]
    if ratios:
        out["mean_edit_ratio"] = statistics.mean(ratios)
    out["per_sentence"] = recs
    return out


EDIT_BUCKETS = [0, 1, 2, 3, 4, 5]  # E = 0 .. 4, then 5 or more
# The passes-against-edit-spans table is printed when outputs mostly copy their
# sources (the mean edit ratio between source and greedy's output at most this,
# as in error correction); a translation's edit spans say nothing about its drafts.
COPY_TASK_EDIT_RATIO = 0.5


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


def beam_width(mode: str) -> int:
    """The beam width a mode searches with (1: greedy and the aggressive modes)."""
    if mode in COMPUTE_TYPES:
        return ct2.beam_of(mode)
    m = re.search(r"beam(\d+)", mode)  # beam5, base_beam5, beam5-native, iad-beam5
    return int(m.group(1)) if m else 1


def describe_mode(mode: str, row: Dict) -> str:
    """A mode's name in the table; a CTranslate2 mode with its configuration (ct2-best: the one it chose)."""
    config = row.get("ct2_config")
    if not config:
        return mode
    return f"{mode} ({ct2.describe_config(config['compute_type'], config['threads'], config.get('workers', 1))})"


def main_table(res):
    """The main table: (the lines above it, its columns, a row of cells per mode in the run's order)."""
    head = []
    has_base = "base_beam5" in res["modes"]
    has_int8 = any(without_target(m).endswith(("-int8", "-sl")) for m in res["modes"])
    has_native = "greedy-native" in res["modes"]
    ct2 = res.get("ct2_fastest")
    has_ct2_beam = any("speedup_vs_ct2_beam" in r for r in res["modes"].values())
    cols = ["mode", "total_s", "ms/sent"] + (["x base beam5"] if has_base else []) + ["x beam5", "x greedy"] + (
        ["x greedy-native"] if has_native else []) + ([f"x {describe_mode(ct2, res['modes'][ct2])}"] if ct2 else []) + (
        ["x CT2's fastest beam of its width"] if has_ct2_beam else []) + ["passes/sent", "ms/pass", "tok/pass", "draft time", "=greedy"] + (["=fp32"] if has_int8 else []) + ["BLEU", "exact"]
    head.append(f"machine: {describe_machine(res['machine'])}")
    if res.get("device"):
        dev = res["device"]
        head.append(f"torch modes on {dev['name']} (CUDA {dev['cuda']}), {dev['dtype']}")
    rounds = res.get("rounds", 1)
    head.append(f"{res['sentences']} sentences, batch {res['batch_size']}, threads: {describe_threads(res['threads'])}; "
                f"{describe_load(res.get('load', 0))}" + (f"; times: the mean of {rounds} rounds" if rounds > 1 else ""))
    rows = []
    for m, r in res["modes"].items():
        cells = [
            describe_mode(m, r), f"{r['total_s']:.2f}", f"{r['mean_ms_per_sentence']:.1f}",
        ] + ([f"{r['speedup_vs_base_beam5']:.2f}"] if has_base else []) + [
            f"{r['speedup_vs_beam5']:.2f}" if "speedup_vs_beam5" in r else "-",
            f"{r['speedup_vs_greedy']:.2f}" if "speedup_vs_greedy" in r else "-",
        ] + ([f"{r['speedup_vs_greedy-native']:.2f}"] if has_native else []) + (
            [f"{r['speedup_vs_ct2']:.2f}"] if ct2 else []) + (
            [f"{r['speedup_vs_ct2_beam']:.2f}" if "speedup_vs_ct2_beam" in r else "-"] if has_ct2_beam else []) + [
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
        rows.append(cells)
    return head, cols, rows


def print_table(res, file=sys.stdout):
    head, cols, rows = main_table(res)
    for line in head:
        print(line, file=file)
    print("| " + " | ".join(cols) + " |", file=file)
    print("|" + "---|" * len(cols), file=file)
    for cells in rows:
        print("| " + " | ".join(cells) + " |", file=file)


def edit_table(res) -> List[str]:
    """Mean passes per sentence against E, the edit spans between source and
    greedy output, with the reference line 1 + 1.3E (one pass, plus 1.3 per
    edit span) and the fewest passes any drafter that
    copies the source can need (one per output token inside a span): the
    table's lines, none where outputs do not mostly copy their sources
    (``COPY_TASK_EDIT_RATIO``) or no mode counted passes."""
    if res.get("mean_edit_ratio", 0.0) > COPY_TASK_EDIT_RATIO:
        return []
    pe = res.get("passes_by_edit_spans") or {}
    modes = [m for m in pe if m in res["modes"]]
    if not modes:
        return []
    keys = []
    for m in modes:
        keys += [k for k in pe[m]["buckets"] if k not in keys]
    first = pe[modes[0]]["buckets"]
    lines = ["| mode | " + " | ".join(f"E={k} ({first[k]['sentences']})" if k in first else f"E={k}" for k in keys)
             + " | all | passes per span | waste/pass | kept a later branch |", "|" + "---|" * (len(keys) + 5)]
    ref = pe[modes[0]]
    for label, key, total in (("reference 1+1.3E", "reference_passes", ref["reference_passes"]),
                              ("bound (copying)", "mean_bound", ref["mean_bound"])):
        cells = [f"{first[k][key]:.2f}" if k in first else "-" for k in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {total:.2f} | - | - | - |")
    for m in modes:
        b, row = pe[m]["buckets"], res["modes"][m]
        cells = [f"{b[k]['mean_passes']:.2f}" if k in b else "-" for k in keys]
        trees = row.get("tree_passes", 0)
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {pe[m]['mean_passes']:.2f} | "
                     f"{pe[m]['passes_per_span']:.2f} | {row.get('wasted_per_pass', 0):.2f} | "
                     + (f"{row.get('branch_wins', 0)}/{trees}" if trees else "-") + " |")
    return lines


def print_edit_table(res, file=sys.stdout):
    lines = edit_table(res)
    if lines:
        print("\npasses per sentence against E, the edit spans between source and greedy's output", file=file)
        print("\n".join(lines), file=file)


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
    ax.set_title(f"{mode} against {base}, by how much the output edits its source", fontsize=10)
    ax.legend()
    _caption(fig, res)
    fig.savefig(path, dpi=120)


def _caption(fig, res):
    """The run's machine, threads and batch under a plot, wrapped to its width; the layout leaves room for it."""
    text = (f"{res['sentences']} sentences, batch {res['batch_size']}, threads: {describe_threads(res['threads'])}; "
            f"{describe_machine(res['machine'])}")
    lines = textwrap.wrap(text, width=int(fig.get_figwidth() * 19))
    fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=6.5)
    fig.tight_layout(rect=(0, 0.025 + 0.035 * len(lines), 1, 1))


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
    ax.set_title("decoder passes against edit spans", fontsize=10)
    ax.legend(fontsize=7)
    _caption(fig, res)
    fig.savefig(path, dpi=120)
