"""What the results tables share: a mode's time, CTranslate2's configuration, a row's key."""
import re
from typing import Dict, List, Optional


def ms_of(r: Dict, mode: str) -> Optional[float]:
    m = r["modes"].get(mode)
    return None if m is None else m["mean_ms_per_sentence"]


def ct2_cell(r: Dict, mode: str) -> str:
    c = r["modes"][mode].get("ct2_config", {})
    return f"{ms_of(r, mode):.2f} ({c.get('compute_type', '?')}, {c.get('threads', '?')}t)"


def row_key(r: Dict):
    return (r["label"], r.get("load", 0), r["batch_size"])


def model_and_load(r: Dict) -> str:
    return r["label"] + (", loaded" if r.get("load") else "")


def short(t: float) -> str:
    return f"{t:.2f}" if t < 10 else f"{t:.1f}"


def ct2_config(row: Dict) -> str:
    c = row.get("ct2_config") or {}
    n = c.get("threads", "?")
    return f"{c.get('compute_type', '?')}, {n} thread{'' if n == 1 else 's'}"


def equal_to_greedy(row: Dict, sentences: int) -> str:
    """A mode's outputs equal to greedy's, of the sentences, with the near-ties among the rest."""
    cell = f"{row.get('identical_to_greedy', '-')}/{sentences}"
    return cell + (f" (+{row['near_ties_with_greedy']} ties)" if row.get("near_ties_with_greedy") else "")


def run_order(r: Dict) -> List[str]:
    """The modes as the run's command lists them (``--bench-modes``), where it does."""
    m = re.search(r"--bench-modes[ =](\S+)", r.get("command", ""))
    return m.group(1).split(",") if m else []
