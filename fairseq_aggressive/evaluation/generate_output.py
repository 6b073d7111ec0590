"""Reading ``fairseq-generate`` output: the ``S-``, ``T-``, ``H-`` lines of each
sentence id (other lines, logs included, are skipped)."""
from typing import Dict, Iterable, List, Tuple


def parse_generate_lines(lines: Iterable[str]) -> Dict[int, Dict[str, str]]:
    """id -> {"S": source, "T": reference, "H": hypothesis, "H_score": its score}
    for every sentence id seen (a key is missing where its line is)."""
    out: Dict[int, Dict[str, str]] = {}
    for line in lines:
        tag, sep, rest = line.rstrip("\n").partition("\t")
        kind, dash, sid = tag.partition("-")
        if not sep or not dash or kind not in ("S", "T", "H") or not sid.isdigit():
            continue
        entry = out.setdefault(int(sid), {})
        if kind == "H":  # H-id <tab> score <tab> text (text may be empty)
            score, _, text = rest.partition("\t")
            entry["H"], entry["H_score"] = text, score
        else:
            entry[kind] = rest
    return out


def read_generate_output(path) -> Dict[int, Dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return parse_generate_lines(f)


def hypotheses_and_references(path) -> Tuple[List[str], List[str]]:
    """Hypotheses and references ("" where absent) in sentence-id order."""
    entries = read_generate_output(path)
    ids = sorted(i for i, e in entries.items() if "H" in e)
    return [entries[i]["H"] for i in ids], [entries[i].get("T", "") for i in ids]
