"""Tables of decoding runs: a run's own table, the build targets, drafted against greedy, the
server, beam search, where a torch-verifier pass spends its time, what limits GAD's acceptance."""
from typing import Dict, List

from ..ct2 import describe_config
from .common import ct2_cell, ct2_config, equal_to_greedy, model_and_load, ms_of, row_key, run_order, short


IAD_MODES = ("greedy-native", "iad", "greedy-native-int8", "iad-int8", "ct2-best")


def _iad_table(results: List[Dict], header: List[str], cells) -> List[str]:
    """A row per result (model, load, batch): ``cells(r, greedy, iad, greedy int8, iad int8, ct2-best)`` (ms)."""
    lines = ["| " + " | ".join(["model", "batch"] + header) + " |", "|" + "---|" * (len(header) + 2)]
    for r in sorted(results, key=row_key):
        ms = [ms_of(r, m) for m in IAD_MODES]
        lines.append("| " + " | ".join([model_and_load(r), str(r["batch_size"])] + cells(r, *ms)) + " |")
    return lines


def drafted_vs_greedy(results: List[Dict]) -> List[str]:
    """IAD against the engine's greedy (float32, int8) and CTranslate2's best, per model, load and batch."""
    return _iad_table(results, ["greedy", "iad", "greedy int8", "iad int8", "CTranslate2 best", "x CT2"],
                      lambda r, g, i, g8, i8, c: [f"{g:.2f}", f"{i:.2f} ({g / i:.2f})", f"{g8:.2f}",
                                                  f"{i8:.2f} ({g8 / i8:.2f})", ct2_cell(r, "ct2-best"),
                                                  f"{c / i:.2f} / {c / i8:.2f}"])


def at_a_glance(results: List[Dict]) -> List[str]:
    """IAD (float32, int8): ms per sentence, against the engine's greedy of its precision and CTranslate2's best."""
    return _iad_table(results, ["IAD ms", "x greedy", "x CTranslate2 best", "IAD int8 ms", "x int8 greedy",
                                "x CTranslate2 best"],
                      lambda r, g, i, g8, i8, c: [f"{i:.2f}", f"{g / i:.2f}", f"{c / i:.2f}", f"{i8:.2f}",
                                                  f"{g8 / i8:.2f}", f"{c / i8:.2f}"])


STREAM_MODES = ("greedy-native-stream", "iad-stream", "greedy-native-int8-stream", "iad-int8-stream")


def ct2_run(r: Dict) -> str:
    """CTranslate2's best of a run: ms per sentence (its configuration, as the bench names it)."""
    c = r["modes"]["ct2-best"].get("ct2_config", {})
    how = describe_config(c.get("compute_type", "?"), c.get("threads", 1), c.get("workers", 1))
    return f"{ms_of(r, 'ct2-best'):.2f} ({how})"


def streams_at_a_glance(results: List[Dict]) -> List[str]:
    """Streamed decoding (``Translator.translate_batch``): ms per sentence of greedy and IAD in float32 and
    int8 ("-" where a run lacks the mode), the faster of each precision against CTranslate2's best of
    the same run, and that best."""
    lines = ["| model | rows | float32 ms: greedy / IAD | x CTranslate2 best | int8 ms: greedy / IAD | "
             "x CTranslate2 best | CTranslate2 best ms |", "|---|---|---|---|---|---|---|"]

    def pair(a, b):
        return " / ".join("-" if x is None else f"{x:.2f}" for x in (a, b))

    def against(c, a, b):
        have = [x for x in (a, b) if x is not None]
        return "-" if not have or c is None else f"{c / min(have):.2f}"

    for r in sorted(results, key=row_key):
        g, i, g8, i8 = (ms_of(r, m) for m in STREAM_MODES)
        c = ms_of(r, "ct2-best")
        lines.append(f"| {model_and_load(r)} | {r['batch_size']} | {pair(g, i)} | {against(c, g, i)} | "
                     f"{pair(g8, i8)} | {against(c, g8, i8)} | {'-' if c is None else ct2_run(r)} |")
    return lines


def serving(results: List[Dict]) -> List[str]:
    """The server benchmark (fairseq-aggressive-bench-serve): per system, one request at a time (p50 /
    p99), the capacity, and p50 / p99 at 0.7 and 0.9 of its capacity; one table per stored run."""
    names = {"iad": "iad", "greedy": "greedy (continuous, no drafts)", "static": "static batches, engine greedy",
             "ct2": "CTranslate2 best, static batches"}
    lines = []
    for r in results:
        load = r["settings"].get("bench_load", 0)
        lines += [f"| {r['label']}, {'quiet' if not load else f'beside {load} busy processes'} | "
                  "one at a time: p50 / p99 ms | "
                  "capacity: sent/s | p50 / p99 ms at 0.7 of capacity | at 0.9 |", "|---|---|---|---|---|"]
        order = [n for n in r["settings"].get("systems", []) if n in r["systems"]]
        for name in order + [n for n in r["systems"] if n not in order]:
            s = r["systems"][name]
            if "latency" not in s:
                lines.append(f"| {names.get(name, name)} | {s.get('error', 'no result')} | | | |")
                continue
            at = {round(p["fraction"], 2): p for p in s.get("open_loop", [])}

            def ms(x):
                return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"

            def point(f):
                p = at.get(f)
                if p is None:
                    return "-"
                refused = f" ({p['refused']} refused)" if p.get("refused") else ""
                return f"{ms(p['p50_ms'])} / {ms(p['p99_ms'])}{refused}"

            lines.append(f"| {names.get(name, name)} | {ms(s['latency']['p50_ms'])} / {ms(s['latency']['p99_ms'])} | "
                         f"{s['capacity']['sentences_per_s']:.0f} | {point(0.7)} | {point(0.9)} |")
        c = {n: r["systems"][n]["check"] for n in order if "check" in r["systems"][n]}
        lines += ["", "Answers equal to the engine's greedy: " + ", ".join(
            f"{n} {v['responses_equal']:,} of {v['responses']:,}" for n, v in c.items()) + "."]
        lines.append("")
    return lines[:-1]


def beam_vs_ct2(results: List[Dict]) -> List[str]:
    """The engine's beam 5 (float32, int8) and drafted beam 5 against fairseq's beam 5 and
    CTranslate2's best beam 5; the outputs equal to the reference's (the engine's beam: fairseq's;
    drafted: the engine's)."""
    lines = ["| model | batch | fairseq beam 5 | engine beam 5 | = fairseq | drafted (iad-beam5) | = engine | "
             "engine beam 5, int8 | CTranslate2 best beam 5 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=row_key):
        c = ms_of(r, "ct2-best-beam5")

        def cell(mode):
            ms = ms_of(r, mode)
            return "-" if ms is None else f"{ms:.2f} ({c / ms:.2f}x)"

        def same(mode):
            n = r["modes"].get(mode, {}).get("identical_to_greedy")
            return "-" if n is None else f"{n}/{r['sentences']}"

        fs = ms_of(r, "beam5")
        lines.append(f"| {model_and_load(r)} | {r['batch_size']} | {'-' if fs is None else f'{fs:.1f}'} | "
                     f"{cell('beam5-native')} | {same('beam5-native')} | {cell('iad-beam5')} | {same('iad-beam5')} | "
                     f"{cell('beam5-native-int8')} | {ct2_cell(r, 'ct2-best-beam5')} |")
    return lines


def bench(results: List[Dict]) -> List[str]:
    """Each stored run's table as the benchmark prints it, after a line with its sentences, batch,
    threads and load: its modes in the command's order, without the columns no mode fills (the
    machine is in the block's last line)."""
    from ..report import main_table

    lines = []
    for r in results:
        head, header, body = main_table(r)
        caption = [line for line in head if not line.startswith("machine: ")][0]
        keep = [j for j in range(len(header)) if j == 0 or any(row[j] != "-" for row in body)]
        order = run_order(r)  # the rows are in the order of r["modes"]
        rank = [order.index(m) if m in order else len(order) for m in r["modes"]]
        body = [row for _, row in sorted(zip(rank, body), key=lambda x: x[0])]
        lines += [f"{r['label']}: {caption}", "", "| " + " | ".join(header[j] for j in keep) + " |",
                  "|" + "---|" * len(keep)]
        lines += ["| " + " | ".join(row[j] for j in keep) + " |" for row in body] + [""]
    return lines[:-1]


def targets(results: List[Dict]) -> List[str]:
    """The engine's build targets side by side, quiet and loaded: a stored run per load of the same
    command (modes ``MODE:TARGET``; no suffix: the machine's own target), ms per sentence and the
    speedup over the run's fastest CTranslate2 mode, in the command's order; the quiet run's
    tokens and ms per pass (the encoder included) and outputs equal to greedy."""
    from ..report import describe_mode

    runs = sorted(results, key=lambda r: r.get("load", 0))
    quiet, loaded = runs[0], (runs[1] if len(runs) > 1 else None)
    native = quiet["machine"].get("native_engine", "-")
    order = run_order(quiet) or list(quiet["modes"])
    lines = [f"| mode | target | quiet | x ct2 |{' loaded | x ct2 |' if loaded else ''} tok/pass | ms/pass (quiet) "
             "| =greedy (quiet) |", "|" + "---|" * (9 if loaded else 7)]

    def cells(r, m):
        row = r["modes"].get(m) if r else None
        if row is None:
            return ["-", "-"]
        t = row["mean_ms_per_sentence"]
        ms = short(t)
        if m.startswith("ct2-best") and row.get("ct2_config"):
            ms += f" ({ct2_config(row)})"
        return [ms, f"{row['speedup_vs_ct2']:.2f}" if "speedup_vs_ct2" in row else "-"]

    def per_pass(row):
        passes = row.get("mean_passes_per_sentence")
        return f"{row['mean_ms_per_sentence'] / passes:.3f}" if passes else "-"

    for m in [m for m in order if m in quiet["modes"]]:
        row = quiet["modes"][m]
        name, _, target = m.partition(":")
        if name.startswith("ct2"):
            name, target = (name if name.startswith("ct2-best") else describe_mode(name, row)), "-"
        elif name in ("greedy", "greedy-int8", "beam5"):
            name, target = f"{name} (fairseq)", "-"
        else:
            target = target or native
        same = equal_to_greedy(row, quiet["sentences"])
        lines.append("| " + " | ".join([name, target] + cells(quiet, m) + (cells(loaded, m) if loaded else [])
                                       + [f"{row['mean_tokens_per_pass']:.2f}", per_pass(row), same]) + " |")
    return lines


def drafters(results: List[Dict]) -> List[str]:
    """Drafted modes beside the engine's greedy, a quiet and a loaded run of one command joined by
    mode (in the command's order): ms per sentence and the speedups over the engine's greedy of
    the run and over its fastest CTranslate2 configuration, the quiet run's tokens per pass, the
    drafter's share of the time and the outputs equal to greedy."""
    from ..report import describe_mode

    runs = sorted(results, key=lambda r: r.get("load", 0))
    quiet, loaded = runs[0], (runs[1] if len(runs) > 1 else None)
    order = [m for m in (run_order(quiet) or list(quiet["modes"])) if m in quiet["modes"]]
    head = ["mode", f"quiet ({quiet['sentences']})", "x greedy-native", "x ct2-best"]
    if loaded:
        head += [f"loaded ({loaded['sentences']})", "x greedy-native", "x ct2-best"]
    lines = ["| " + " | ".join(head + ["tokens per pass", "draft time", "=greedy (quiet)"]) + " |",
             "|" + "---|" * (len(head) + 3)]

    def cells(r, m):
        row = r["modes"].get(m) if r else None
        if row is None:
            return ["-", "-", "-"]
        g, c = row.get("speedup_vs_greedy-native"), row.get("speedup_vs_ct2")
        return [short(row["mean_ms_per_sentence"]), "-" if g is None else f"{g:.2f}", "-" if c is None else f"{c:.2f}"]

    for m in order:
        row = quiet["modes"][m]
        name = describe_mode(m, row) if m.startswith("ct2") else {"greedy": "greedy (fairseq)"}.get(m, m)
        share = row.get("draft_time_share")
        same = equal_to_greedy(row, quiet["sentences"])
        lines.append("| " + " | ".join([name] + cells(quiet, m) + (cells(loaded, m) if loaded else [])
                                       + [f"{row['mean_tokens_per_pass']:.2f}",
                                          "-" if not share else f"{100 * share:.0f}%", same]) + " |")
    return lines


def edit_spans(results: List[Dict]) -> List[str]:
    """Each stored run's passes per sentence against E, the edit spans between source and greedy's
    output, as the benchmark prints it (with the copying bound and the reference 1 + 1.3E)."""
    from ..report import edit_table

    lines = []
    for r in results:
        pe = r.get("passes_by_edit_spans") or {}
        order = [m for m in run_order(r) if m in pe] + [m for m in pe if m not in run_order(r)]
        r = dict(r, passes_by_edit_spans={m: pe[m] for m in order})  # the command's order (stored: sorted)
        lines += [f"{r['label']}, batch {r['batch_size']}:", ""] + edit_table(r) + [""]
    return lines[:-1]


TORCH_PARTS = {"encoder": "encoder (its layers, encoder-attention keys/values, cache)",
               "verifier forward": "verifier forward (decoder layers over the draft)",
               "scoring + acceptance": "scoring + acceptance (vocabulary projection, adjustments, argmax)",
               "drafter": "drafter", "rest (generator Python)": "rest (the generator's Python)"}


def torch_pass(results: List[Dict]) -> List[str]:
    """Where an IAD pass of the torch verifier spends its time (``profile_pass.py --json``), per
    stored run: its parts per sentence and per pass, one pass by the positions it scores, and the
    torch operators that take the most time."""
    lines = []
    for r in results:
        per_pass = r["passes_per_sentence"]
        lines += [f"{r['label']}, {r['sentences']} sentences, batch 1, {r['threads']} threads: IAD "
                  f"{r['ms_per_sentence']:.2f} ms per sentence, {per_pass:.2f} passes per sentence, "
                  f"{r['tokens_per_pass']:.2f} tokens per pass.", "",
                  "| part | ms per sentence | ms per pass | share |", "|---|---|---|---|"]
        parts = r["parts_ms_per_sentence"]  # in the order of a pass (a stored result's keys are sorted)
        for k in [k for k in TORCH_PARTS if k in parts] + sorted(set(parts) - set(TORCH_PARTS)):
            ms = parts[k]
            lines.append(f"| {TORCH_PARTS.get(k, k)} | {ms:.2f} | {ms / per_pass:.2f} | "
                         f"{100 * ms / r['ms_per_sentence']:.0f}% |")
        widths = sorted(r["passes"], key=int)
        lines += ["", "| positions scored | " + " | ".join(widths) + " |", "|" + "---|" * (len(widths) + 1),
                  "| ms per pass (forward + scoring) | "
                  + " | ".join(f"{r['passes'][w]['median_ms']:.2f}" for w in widths) + " |"]
        prof = r["profiled"]
        lines += ["", f"| operator (over {prof['sentences']} sentences, {prof['passes']} passes; "
                      f"{prof['aten_calls'] / prof['passes']:.0f} aten calls per pass, nested ones included) "
                      "| calls per pass | µs per call | self ms per pass |", "|---|---|---|---|"]
        for op in prof["top_ops"]:
            lines.append(f"| `{op['op']}` | {op['calls'] / prof['passes']:.1f} | "
                         f"{1000 * op['self_ms'] / op['calls']:.0f} | {op['self_ms'] / prof['passes']:.3f} |")
        lines.append("")
    return lines[:-1]


def gad_limits(results: List[Dict]) -> List[str]:
    """What limits exact GAD's acceptance (``gad_limits.py --json``), per stored run: how sure the
    verifier is of its own greedy choices, and the drafter's accuracy per slot and its mean run of
    correct leading slots (what exact GAD accepts), with and without the verifier's features."""
    lines = []
    for r in results:
        t, k = r["top1"], max(len(s["accuracy"]) for s in r["slots"].values())
        lines += [f"{r['label']}, {r['sentences']} sentences of {r['subset']} ({r['tokens']} target tokens), "
                  f"block size {r['block_size']}: the verifier's top-1 probability on its own greedy choices, mean "
                  f"{t['mean']:.2f}, median {t['median']:.2f}, above 0.9 for {100 * t['above_0.9']:.0f}% of them.", "",
                  "| drafter | " + " | ".join(f"slot {i}" for i in range(1, k + 1)) + " | leading slots correct |",
                  "|" + "---|" * (k + 2)]
        for v, s in r["slots"].items():
            lines.append(f"| {v} | " + " | ".join(f"{x:.2f}" for x in s["accuracy"]) + f" | {s['leading']:.2f} |")
        lines.append("")
    return lines[:-1]


HUB_NAMES = {"greedy": "fairseq's greedy (hub)", "iad": "hub iad"}


def hub_latency(results: List[Dict]) -> List[str]:
    """One sentence per call (``hub_latency.py --json``), a row per stored run: each mode's ms per
    sentence (decoding / the rest: the hub's or ``Translator``'s BPE, batching and strings), CTranslate2's
    fastest configuration, and the aggressive modes against it."""
    modes = [m for m in ("translator:iad", "iad", "greedy", "ct2-best")
             if any(m in r["modes"] for r in results)]
    fast = [m for m in modes if m not in ("greedy", "ct2-best")]
    lines = ["| model, load | " + " | ".join(HUB_NAMES.get(m, m) for m in modes)
             + " | against ct2-best: " + ", ".join(HUB_NAMES.get(m, m) for m in fast) + " |",
             "|" + "---|" * (len(modes) + 2)]
    for r in sorted(results, key=lambda r: (r["label"], r.get("load", 0))):
        cells = []
        for m in modes:
            row = r["modes"].get(m)
            if row is None:
                cells.append("-")
            elif m == "ct2-best":
                cells.append(f"{row['mean_ms_per_sentence']:.2f} ({ct2_config(row)})")
            else:
                ms = row["mean_ms_per_sentence"]
                cells.append(f"{ms:.2f} ({row['decoding_ms']:.2f} / {ms - row['decoding_ms']:.2f})")
        best = r["modes"].get("ct2-best")
        ratios = [f"{best['mean_ms_per_sentence'] / r['modes'][m]['mean_ms_per_sentence']:.2f}x"
                  if best and m in r["modes"] else "-" for m in fast]
        lines.append(f"| {model_and_load(r)} | " + " | ".join(cells) + " | " + ", ".join(ratios) + " |")
    same = []
    for r in sorted(results, key=lambda r: (r["label"], r.get("load", 0))):
        key, first = "identical_to_" + r["first"], HUB_NAMES.get(r["first"], r["first"])
        same.append(f"{model_and_load(r)}, equal to {first}'s: " + ", ".join(
            f"{HUB_NAMES.get(m, m)} {r['modes'][m][key]}/{r['sentences']}" for m in modes
            if m in r["modes"] and m != r["first"]))
    return lines + ["", "Outputs: " + "; ".join(same) + "."]


def http_overhead(results: List[Dict]) -> List[str]:
    """What HTTP costs (``http_overhead.py --json``), a row per stored run: one request at a time
    over keep-alive HTTP against ``Translator`` in process (p50 / p99 ms), and capacity over HTTP
    against the same backend driven in process (sentences per second)."""
    lines = ["| model, load | HTTP p50 / p99 ms | Translator p50 / p99 ms | p50 ratio | HTTP capacity | "
             "in-process capacity | capacity ratio |", "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["label"], r.get("load", 0))):
        h, p = r["systems"]["http"], r["systems"]["in-process"]
        lines.append(f"| {model_and_load(r)} | {short(h['p50_ms'])} / {short(h['p99_ms'])} | {short(p['p50_ms'])} / "
                     f"{short(p['p99_ms'])} | {r['p50_ratio']:.2f}x | {h['capacity']:.0f}/s | {p['capacity']:.0f}/s | "
                     f"{r['capacity_ratio']:.2f}x |")
    n = {r["clients"] for r in results}
    lines += ["", f"{'/'.join(map(str, sorted(n)))} closed-loop clients for capacity; "
              f"{'/'.join(str(r['threads']) for r in results[:1])} engine thread(s); every answer checked "
              "against the in-process output."]
    return lines
