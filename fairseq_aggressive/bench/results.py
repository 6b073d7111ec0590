"""Results as data: benchmark JSONs stored under ``results/`` and the docs'
tables made from them.

A stored result is a benchmark's JSON (``fairseq-aggressive-bench
--bench-json``) without its per-sentence records, with the command that made
it, the commit that ran and a label for the table (``add``).  A page of docs/
holds a generated table between two markers::

    <!-- results: TABLE GLOB -->
    ... (made by scripts/results.py; edits here are overwritten) ...
    <!-- /results -->

TABLE names one of :data:`TABLES`, GLOB the stored results it reads (under
``results/``, sorted by name; several globs joined by commas).
``render(page)`` remakes every such block from the stored results;
``python scripts/results.py tables --check`` fails where a page differs from
what its results make (the test suite runs it).
"""
import glob
import json
import os
import re
from typing import Dict, List, Optional

from .tables import TABLES

BLOCK = re.compile(r"(<!-- results: (?P<table>[\w-]+) (?P<glob>\S+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


class ResultsError(ValueError):
    pass


def stored(result: Dict, label: str, command: Optional[str] = None, commit: Optional[str] = None) -> Dict:
    """``result`` (a benchmark JSON) as stored: no per-sentence or per-request records (nor the server
    benchmark's log tails), its command, commit and label."""
    out = {k: v for k, v in result.items() if k not in ("per_sentence", "per_request")}
    if isinstance(out.get("systems"), dict):
        out["systems"] = {n: {k: v for k, v in s.items() if k != "server_log_tail"} for n, s in out["systems"].items()}
    if command:
        out["command"] = command
    if commit:
        out["commit"] = commit
    missing = [k for k in ("command", "commit", "machine") if not out.get(k)]
    if not any(out.get(k) for k in ("modes", "systems", "passes", "slots", "stages")):
        missing.append("modes (a benchmark's), systems (the server benchmark's), passes (pass_cost.py's, "
                       "profile_pass.py's), slots (gad_limits.py's) or stages (stage_profile.py's)")
    if missing:
        raise ResultsError(f"a stored result needs {', '.join(missing)} (a JSON made before the benchmark "
                           "recorded its command and commit: pass --command and --commit)")
    out["label"] = label
    return out


def load(root: str, pattern: str) -> List[Dict]:
    """The stored results under ``root``/results that ``pattern`` matches (globs joined by commas),
    sorted by path, each with its ``_path`` there."""
    paths = sorted({p for g in pattern.split(",") for p in glob.glob(os.path.join(root, "results", g))})
    if not paths:
        raise ResultsError(f"no stored results match {pattern}")
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            r = json.load(f)
        r["_path"] = os.path.relpath(p, os.path.join(root, "results"))
        out.append(r)
    return out


def _machine(m: Dict) -> str:
    """The CPU a result was measured on (what every row of a table shares; threads are the command's)."""
    family = f" (family/model {m['cpu_family']})" if m.get("cpu_family") else ""
    return (f"{m['cpu_model']}{family}, {m['cores']} cores, {m['cpu_capability']}, engine target "
            f"{m.get('native_engine', '-')}, torch {m['torch']}")


def _provenance(results: List[Dict]) -> List[str]:
    machines = sorted({_machine(r["machine"]) for r in results})
    commits = sorted({r["commit"] for r in results})
    dirs = ", ".join(f"results/{d}/" for d in sorted({os.path.dirname(r["_path"]) for r in results}))
    what = "1 stored result" if len(results) == 1 else f"{len(results)} stored results"
    return ["", f"Made by `scripts/results.py` from {what} in {dirs} ({'' if len(results) == 1 else 'each '}with its "
            f"command); commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}; machine: {'; '.join(machines)}."]


def render(page: str, root: str) -> str:
    """``page`` (a doc's text) with every results block made again from the stored results under ``root``."""

    def remake(m):
        table = m.group("table")
        if table not in TABLES:
            raise ResultsError(f"unknown results table {table!r} (known: {', '.join(TABLES)})")
        results = load(root, m.group("glob"))
        body = TABLES[table](results) + _provenance(results)
        return m.group(1) + "\n".join(body) + "\n" + m.group(5)

    return BLOCK.sub(remake, page)


def pages(root: str) -> List[str]:
    """The pages with results blocks: README.md and docs/*.md."""
    out = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return [p for p in out if os.path.exists(p) and "<!-- results:" in open(p, encoding="utf-8").read()]
