"""Tables of the CPU engine against CTranslate2 by model (``scripts/experiments/cpu_engine_tables.py``
runs): speed quiet and loaded, the loop in the engine, a pass against a step, exactness, W
decoders, runs side by side, and what a pass costs by width (``pass_cost.py``)."""
from typing import Dict, List

from .common import ct2_config, equal_to_greedy, ms_of, run_order, short


def _cost(r: Dict) -> float:
    """What a run's model costs per sentence, to order models: the engine's greedy or IAD (ms per
    sentence, or a decoder's seconds per sentence in a run of workers)."""
    for m in ("greedy-native", "iad"):
        row = r["modes"].get(m, {})
        if "mean_ms_per_sentence" in row:
            return row["mean_ms_per_sentence"]
        if row.get("sentences_per_s"):
            return r.get("workers", 1) / row["sentences_per_s"]
    return 0.0


def _by_model(results: List[Dict]) -> List[List[Dict]]:
    """The runs of each model (label), each model's runs by workers and load, the models from the
    cheapest (its first run's engine greedy or IAD per sentence) to the dearest."""
    groups: Dict[str, List[Dict]] = {}
    for r in results:
        groups.setdefault(r["label"], []).append(r)
    runs = [sorted(g, key=lambda r: (r.get("workers", 1), r.get("load", 0))) for g in groups.values()]
    return sorted(runs, key=lambda g: _cost(g[0]))


def vs_ct2(results: List[Dict]) -> List[str]:
    """Per model, the engine's greedy and IAD (float32, int8) quiet / loaded (ms per sentence) and
    their speedups over the run's fastest CTranslate2 configuration (``ct2-best``, named)."""
    modes = ("greedy-native", "iad", "greedy-native-int8", "iad-int8")
    lines = ["| model | " + " | ".join(modes) + " | ct2-best (quiet; loaded) |", "|" + "---|" * (len(modes) + 2)]
    for runs in _by_model(results):
        cells = []
        for m in modes:
            rows = [r["modes"][m] for r in runs]
            cells.append(" / ".join(short(x["mean_ms_per_sentence"]) for x in rows) + " ("
                         + " / ".join(f"{x['speedup_vs_ct2']:.2f}x" for x in rows) + ")")
        best = "; ".join(f"{short(r['modes']['ct2-best']['mean_ms_per_sentence'])} "
                         f"({ct2_config(r['modes']['ct2-best'])})" for r in runs)
        lines.append(f"| {runs[0]['label']} | " + " | ".join(cells) + f" | {best} |")
    return lines


def loop_in_engine(results: List[Dict]) -> List[str]:
    """Per model, each loop run by the generator in Python (``-pyloop``) against the same loop in
    the engine, ms per sentence quiet / loaded and the change."""
    modes = ("greedy-native", "iad", "iad-int8")
    lines = ["| model | " + " | ".join(f"{m}-pyloop -> {m}" for m in modes) + " | tokens per pass, iad; iad-int8 "
             "(quiet) |", "|" + "---|" * (len(modes) + 2)]
    for runs in _by_model(results):
        cells = []
        for m in modes:
            parts = []
            for r in runs:
                py, native = ms_of(r, m + "-pyloop"), ms_of(r, m)
                parts.append(f"{short(py)} -> {short(native)} ({(native / py - 1) * 100:+.0f}%)")
            cells.append(" / ".join(parts))
        q = runs[0]["modes"]
        cells.append("; ".join(f"{q[m + '-pyloop']['mean_tokens_per_pass']:.2f} -> {q[m]['mean_tokens_per_pass']:.2f}"
                               for m in ("iad", "iad-int8")))
        lines.append(f"| {runs[0]['label']} | " + " | ".join(cells) + " |")
    return lines


def pass_vs_step(results: List[Dict]) -> List[str]:
    """Per model (its quiet run), what an IAD pass costs against a greedy step (the benchmark's ms per
    pass: a sentence's time over its passes, the encoder included), IAD's tokens per pass and the
    share of drafted tokens accepted at draft positions 1-4 (of the drafts that reached them)."""
    lines = ["| model | float32: IAD pass / greedy step | int8: IAD pass / greedy step | tokens per pass | "
             "accepted at positions 1-4 |", "|---|---|---|---|---|"]

    def per_pass(r, m):
        row = r["modes"][m]
        return row["mean_ms_per_sentence"] / row["mean_passes_per_sentence"]

    for runs in _by_model(results):
        q = runs[0]
        cells = []
        for g, i in (("greedy-native", "iad"), ("greedy-native-int8", "iad-int8")):
            a, b = per_pass(q, i), per_pass(q, g)
            cells.append(f"{a:.3f} / {b:.3f} ms = {a / b:.2f}")
        acc = " ".join(f"{x:.2f}" for x in q["modes"]["iad"].get("acceptance_by_position", [])[:4])
        lines.append(f"| {q['label']} | " + " | ".join(cells)
                     + f" | {q['modes']['iad']['mean_tokens_per_pass']:.2f} | {acc or '-'} |")
    return lines


def exactness(results: List[Dict]) -> List[str]:
    """Per model, each mode's outputs equal to fairseq's greedy of the same model (int8 modes: of the
    same int8 model), the near-ties among the others counted, and what differs otherwise."""
    order = ("greedy-native", "iad", "greedy-int8", "greedy-native-int8", "iad-int8")
    lines = ["| model | sentences | " + " | ".join(order) + " | other differences |", "|" + "---|" * (len(order) + 3)]
    for runs in _by_model(results):
        r = runs[0]
        n, cells, other = r["sentences"], [], 0
        for m in order:
            row = r["modes"].get(m)
            if row is None or m == "greedy-int8":
                cells.append("reference" if row is not None else "-")
                continue
            other += n - row.get("identical_to_greedy", 0) - row.get("near_ties_with_greedy", 0)
            cells.append(equal_to_greedy(row, n))
        lines.append(f"| {r['label']} | {n} | " + " | ".join(cells) + f" | {other} |")
    return lines


def workers(results: List[Dict]) -> List[str]:
    """W decoders serving one request each at a time (``--bench-workers W``), per model and mode:
    sentences per second (the workers' peak resident memory, MB) by W and load, and the speedup
    over the run's fastest CTranslate2 configuration (``inter_threads=W``)."""
    cols = sorted({(r["workers"], r.get("load", 0)) for r in results})
    kinds = {r.get("worker_kind", "processes") for r in results if r["workers"] > 1}

    def head(w, load):
        return ("1 decoder" if w == 1 else f"W={w}") + (" loaded" if load else (" quiet" if w > 1 else ""))

    lines = [f"| model, mode ({'/'.join(sorted(kinds))}) | " + " | ".join(head(*c) for c in cols) + " |",
             "|" + "---|" * (len(cols) + 1)]
    for runs in _by_model(results):
        at = {(r["workers"], r.get("load", 0)): r for r in runs}
        modes = [m for m in ("greedy-native", "iad", "iad-int8", "ct2-best") if any(m in r["modes"] for r in runs)]
        for m in modes:
            cells = []
            for c in cols:
                r = at.get(c)
                row = r["modes"].get(m) if r else None
                if row is None:
                    cells.append("-")
                    continue
                cell = f"{row['sentences_per_s']:,.1f}"
                if m.startswith("ct2"):
                    cell += f" ({(row.get('ct2_config') or {}).get('compute_type', '?')})"
                else:
                    cell += f" ({row['peak_rss_mb']:,.0f})"
                    best = r.get("ct2_fastest")
                    if best and best in r["modes"]:
                        cell += f"; {row['sentences_per_s'] / r['modes'][best]['sentences_per_s']:.2f}x"
                cells.append(cell)
            name = f"{m}, inter_threads=W" if m.startswith("ct2") else m
            lines.append(f"| {runs[0]['label']}, {name} | " + " | ".join(cells) + " |")
    return lines


def side_by_side(results: List[Dict]) -> List[str]:
    """Stored runs of one model side by side, a column per run (named by its load, its threads and
    its workers): ms per sentence (a run of workers: sentences per second and latency p50 / p95),
    CTranslate2's fastest configuration named, and IAD's speedup over it in each run."""
    batches = len({r.get("batch_size", 1) for r in results}) > 1

    def head(r):
        t = r.get("threads")
        t = (t.get("engine") or [None])[0] if isinstance(t, dict) else r.get("threads_per_worker")
        parts = ["loaded" if r.get("load") else "quiet"] + ([f"batch {r.get('batch_size', 1)}"] if batches else [])
        if isinstance(t, int):
            parts.append(f"{t} thread{'' if t == 1 else 's'}{' each' if r.get('workers', 1) > 1 else ''}")
        if r.get("workers", 1) > 1:
            parts.append(f"{r['workers']} {r.get('worker_kind', 'processes')}: sent/s, p50 / p95 ms")
        return ", ".join(parts)

    order: List[str] = []
    for r in sorted(results, key=lambda r: -len(r["modes"])):  # the run with the most modes first
        order += [m for m in (run_order(r) or list(r["modes"])) if m not in order]
    lines = ["| mode | " + " | ".join(head(r) for r in results) + " |", "|" + "---|" * (len(results) + 1)]

    def cell(r, m):
        row = r["modes"].get(m)
        if row is None:
            return "-"
        if "sentences_per_s" in row:
            text = f"{row['sentences_per_s']:.1f}, {row['latency_ms_p50']:.1f} / {row['latency_ms_p95']:.1f}"
        else:
            text = short(row["mean_ms_per_sentence"])
        return text + (f" ({ct2_config(row)})" if m == "ct2-best" and row.get("ct2_config") else "")

    for m in order:
        name = {"greedy": "greedy (fairseq)", "ct2": "ct2 (CTranslate2 float32 greedy)"}.get(m, m)
        lines.append(f"| {name} | " + " | ".join(cell(r, m) for r in results) + " |")

    def ratio(r):
        i, c = r["modes"].get("iad"), r["modes"].get("ct2-best")
        if not i or not c:
            return "-"
        if "sentences_per_s" in i:
            return f"{i['sentences_per_s'] / c['sentences_per_s']:.2f}x"
        return f"{c['mean_ms_per_sentence'] / i['mean_ms_per_sentence']:.2f}x"

    return lines + ["| iad against ct2-best, same run | " + " | ".join(ratio(r) for r in results) + " |"]


def _pass_name(r: Dict) -> str:
    where = [r["label"], r["precision"]]
    if r.get("warm_steps"):
        where.append(f"after {r['prefix']} tokens and {r['warm_steps']} steps")
    elif r.get("prefix"):
        where.append(f"after {r['prefix']} tokens")
    if r.get("load"):
        where.append(f"beside {r['load']} busy processes")
    return ", ".join(where)


def pass_cost(results: List[Dict]) -> List[str]:
    """What one engine pass over T positions costs (``pass_cost.py``: every drafted token accepted,
    all T projected), per stored run: a step's median ms (T=1) and each T's median against it."""
    widths = sorted({int(T) for r in results for T in r["passes"]})
    lines = ["| model, precision, where | T=1 (a step) | " + " | ".join(f"T={T}" for T in widths if T > 1) + " |",
             "|" + "---|" * (len(widths) + 1)]
    for r in results:
        p = r["passes"]
        step = p["1"]["median_ms"]
        cells = [f"{p[str(T)]['median_ms'] / step:.2f}x" if str(T) in p else "-" for T in widths if T > 1]
        lines.append(f"| {_pass_name(r)} | {step:.3f} ms | " + " | ".join(cells) + " |")
    return lines


def pass_rows(results: List[Dict]) -> List[str]:
    """What drafting can save a beam at most (``pass_cost.py`` at widths b, 2b, ...): per stored
    run, each width's ms per pass, the least-squares line (fixed ms + ms per row) through them, and
    k steps of a beam of b (the smallest width) put into one pass of k*b rows (the largest) against
    k passes of b rows: the most drafting every hypothesis could gain, every draft accepted."""
    lines = []
    for r in results:
        widths = sorted(int(T) for T in r["passes"] if int(T) > 1)
        ms = [r["passes"][str(T)]["median_ms"] for T in widths]
        n, mx, my = len(widths), sum(widths) / len(widths), sum(ms) / len(ms)
        if n < 2:
            raise ValueError(f"{r.get('_path', r['label'])}: pass-rows needs passes at two widths above 1 or more")
        slope = sum((x - mx) * (y - my) for x, y in zip(widths, ms)) / sum((x - mx) ** 2 for x in widths)
        b, k = widths[0], widths[-1] // widths[0]
        if not lines:
            lines = ["| model, precision, where | " + " | ".join(f"{T} rows" for T in widths)
                     + " | fixed + per row | at most |", "|" + "---|" * (n + 3)]
        lines.append(f"| {_pass_name(r)} | " + " | ".join(f"{t:.3f} ms" for t in ms)
                     + f" | {my - slope * mx:.3f} + {slope:.3f} ms | {k * ms[0] / ms[-1]:.2f}x "
                       f"({k} steps of {b} in one pass) |")
    return lines


def pass_stages(results: List[Dict]) -> List[str]:
    """Where a pass's time goes (``pass_cost.py --stages``): per stored run, ms per pass in each
    stage at T=1 and what each adds at the larger T."""
    from ...diagnostics.stages import STAGES

    lines = []
    for r in results:
        per = r["stages_ms"]
        widths = sorted(per, key=int)
        # the stages in the order of a pass (a stored result's keys are sorted), then the rest
        order = [n for n in STAGES if n in per[widths[0]]]
        base = {n: per[widths[0]][n] for n in order + sorted(set(per[widths[0]]) - set(order),
                                                              key=lambda n: n == "outside the pass")}
        lines += [f"{_pass_name(r)}:", "", f"| stage | T={widths[0]} | + at T = {', '.join(widths[1:])} |",
                  "|---|---|---|"]
        for n in base:
            lines.append(f"| {n} | {base[n]:.3f} | " + ", ".join(f"{per[T][n] - base[n]:+.3f}" for T in widths[1:])
                         + " |")
        total = {T: sum(per[T].values()) for T in widths}
        lines += [f"| total | {total[widths[0]]:.3f} | "
                  + ", ".join(f"{total[T] - total[widths[0]]:+.3f}" for T in widths[1:]) + " |", ""]
    return lines[:-1]


# stage_profile.py's parts, in the order of a sentence's decoding
PROFILE_PARTS = ("encoder", "embed", "self q/k/v", "self attention", "self out", "cross q", "cross attention",
                 "cross out", "ffn", "projection", "choose", "emit", "pass (rest)", "drafting", "loop (rest)",
                 "join (rest)", "python")


def stage_profile(results: List[Dict]) -> List[str]:
    """Where a streamed sentence's time goes (``stage_profile.py --json``): per stored run, per
    row count ms per sentence in each part (its share), the multiply-adds it needs per sentence
    and the rate it ran at, then the totals."""
    lines = []
    for r in results:
        per = r["stages"]
        rows = sorted(per, key=int)
        s = r["shapes"]
        lines += [f"{r['label']}, {r['decoding']}, {r['sentences']} sentences, "
                  f"{'quiet' if not r.get('load') else str(r['load']) + ' busy processes beside it'} "
                  f"(C {s['C']}, FFN {s['F']}, {s['enc_layers']}+{s['dec_layers']} layers, vocabulary {s['vocab']}); "
                  "ms per sentence (share) and GMAC/s:", "",
                  "| part | MMAC per sentence | " + " | ".join(f"B={b}" for b in rows) + " |",
                  "|---|---|" + "---|" * len(rows)]
        for part in PROFILE_PARTS:
            cells = []
            for b in rows:
                c = per[b]["stages"][part]
                rate = f", {c['gmacs']:.0f}" if c.get("gmacs") else ""
                cells.append(f"{c['ms']:.3f} ({100 * c['share']:.0f}%){rate}")
            need = per[rows[-1]]["stages"][part]["macs"]
            lines.append(f"| {part} | {need / 1e6:.1f} | " + " | ".join(cells) + " |" if need else
                         f"| {part} | | " + " | ".join(cells) + " |")
        lines.append("| total | | " + " | ".join(f"{per[b]['ms_per_sentence']:.3f}, {per[b]['total_gmacs']:.0f}"
                                                for b in rows) + " |")
        lines.append("| linear layers, GMAC/s | | " + " | ".join(f"{per[b]['linear_gmacs']:.0f}" for b in rows) + " |")
        lines.append("| passes per sentence | | " + " | ".join(f"{per[b]['passes_per_sentence']:.1f}" for b in rows)
                     + " |")
        lines.append("")
    return lines[:-1]
