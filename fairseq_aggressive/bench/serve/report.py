"""The result as Markdown tables, and latency against throughput as a plot."""
import os
from typing import Dict, List


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def _cells(p: Dict) -> List[str]:
    return [str(p["ok"]), str(p["refused"]), str(p["errors"]), _fmt(p["p50_ms"], 2), _fmt(p["p90_ms"], 2),
            _fmt(p["p99_ms"], 2), _fmt(p["sentences_per_s"])]


def _row(cells: List[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def tables(result: Dict) -> str:
    systems = result["systems"]
    names = [s for s in result["settings"]["systems"] if s in systems and "error" not in systems[s]]
    bases = [b for b in ("greedy", "ct2") if b in names]
    out = []

    def header(first: List[str]) -> List[str]:
        cols = first + ["refused", "failed", "ms p50", "ms p90", "ms p99", "sent/s"] + [f"vs {b}" for b in bases]
        return [_row(cols), "|" + "|".join("---" for _ in cols) + "|"]

    out.append("### latency: one request at a time")
    out.append("(vs X: X's p50 / this p50; > 1: lower latency)")
    out += header(["system", "answered"])
    for s in names:
        p = systems[s]["latency"]
        out.append(_row([s] + _cells(p) + [_ratio(systems[b]["latency"]["p50_ms"], p["p50_ms"]) for b in bases]))
    out.append("")
    out.append(f"### capacity: {result['settings']['clients']} closed-loop clients")
    out.append("(vs X: this sent/s / X's; > 1: more sentences per second)")
    out += header(["system", "answered"])
    for s in names:
        p = systems[s]["capacity"]
        out.append(_row([s] + _cells(p) + [_ratio(p["sentences_per_s"], systems[b]["capacity"]["sentences_per_s"])
                                           for b in bases]))
    out.append("")
    out.append("### open loop: Poisson arrivals at a fraction of each system's own capacity")
    out.append("(vs X: X's p50 / this p50 at the same fraction; > 1: lower latency, at this system's offered rate)")
    out += header(["system", "load", "offered/s", "answered"])
    for k, f in enumerate(result["settings"]["rates"]):
        for s in names:
            pts = systems[s]["open_loop"]
            if k >= len(pts):
                continue
            p = pts[k]
            ratios = []
            for b in bases:
                bp = systems[b]["open_loop"]
                ratios.append(_ratio(bp[k]["p50_ms"], p["p50_ms"]) if k < len(bp) else "-")
            out.append(_row([s, f"{f:g}", _fmt(p["offered_per_s"])] + _cells(p) + ratios))
    decoders = [s for s in names if (systems[s].get("server_metrics") or {}).get("passes")]
    if decoders:
        out += ["", "### decoder passes of the continuous-batching servers, by phase (their /metrics)",
                "| system | phase | passes | rows/pass | passes > 8 rows | tokens per row-pass |",
                "|---|---|---|---|---|---|"]
        for s in decoders:
            r = systems[s]
            phases = [("latency", r["latency"]), ("capacity", r["capacity"])] + [
                (f"open {p['fraction']:g}", p) for p in r["open_loop"]]
            for label, p in phases:
                d = p.get("decoder") or {}
                if d.get("passes"):
                    out.append(f"| {s} | {label} | {d['passes']} | {d['rows_per_pass']:.2f} | "
                               f"{100 * d['passes_over_8_rows']:.1f}% | {d['tokens_per_row_pass']:.2f} |")
    return "\n".join(out)


def plot(result: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (name, r) in enumerate(result["systems"].items()):
        if "error" in r:
            continue
        # in the order of the load (open-loop points, then the closed loop): an
        # overloaded point (less throughput, more latency) shows as a hook back
        pts = [p for p in r["open_loop"] + [r["capacity"]] if p["sentences_per_s"] and p["p50_ms"] is not None]
        x = [p["sentences_per_s"] for p in pts]
        color = f"C{k}"
        ax.plot(x, [p["p50_ms"] for p in pts], "o-", color=color, label=f"{name} p50")
        ax.plot(x, [p["p99_ms"] for p in pts], "s--", color=color, label=f"{name} p99")
    ax.set_xlabel("throughput (sentences/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    s = result["settings"]
    ax.set_title(f"open loop at {', '.join(f'{f:g}' for f in s['rates'])} x capacity, and {s['clients']} "
                 f"closed-loop clients (last point)\nmax-batch {s['max_batch']}, {s['workers']} worker(s), "
                 f"load {s['bench_load']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
