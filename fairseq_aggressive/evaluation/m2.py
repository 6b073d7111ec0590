"""MaxMatch (M2) scorer for grammatical error correction.

An independent implementation of the method of Dahlmeier & Ng (2012),
"Better Evaluation for Grammatical Error Correction", following the defaults
and the output format of the official NUS ``m2scorer`` (beta = 0.5,
max_unchanged_words = 2, ignore_whitespace_casing = False).

Algorithm (per sentence, per annotator)
---------------------------------------
1. Edit lattice.  The vertices/edges are those lying on *some* optimal
   token-level Levenshtein alignment of source -> hypothesis, taking the
   union of the lattices obtained with substitution cost 1 and substitution
   cost 2 (insertion/deletion cost 1), as the official scorer does.  Every
   edge is one step: ``noop`` (token kept), substitution, insertion or
   deletion.
2. Merged ("transitive") edges.  Any lattice path that contains at least one
   changed step and at most ``max_unchanged_words`` unchanged (noop) steps can
   be used as a single edit covering source[i1:i2] -> hypothesis[j1:j2].
3. Weights.  A (merged or simple) edge whose edit equals a gold edit (same
   start, end, original tokens, correction among the gold alternatives) is a
   gold edge.  The best path minimises, lexicographically,
   ``(-#gold edges, #lattice steps not covered by gold edges,
   #non-gold edits, #unchanged words inside non-gold edits)``.  The first
   three components are exactly what the official weights
   (``-|E|`` for gold edges, ``1`` per step, ``+0.001`` per non-gold edit)
   rank; the last one only chooses, among otherwise equal paths, the
   tightest edit spans (it never changes the counts).  Instead of
   materialising the O(V^2) transitive edges the path search runs a dynamic
   programme over (vertex, inside-an-open-edit, #unchanged words) states,
   which is equivalent and linear in the lattice size.
4. Counting.  The non-noop edits on the best path are the system edits
   (with ``ignore_whitespace_casing`` those whose original and correction are
   equal after removing spaces and lower-casing are dropped).  A system edit
   is correct if it equals a not yet matched gold edit (one-to-one matching).

Multiple annotators
-------------------
As in the official scorer, each sentence is scored against every annotator
(in ascending annotator-id order) and the annotator chosen is the one that
maximises the *running corpus-level* F_beta computed on counts,
``(1+b^2)*TP / (b^2*GOLD + PROPOSED)`` (``1.0`` when the denominator is 0).
Ties are broken by the larger running TP, then by the smaller
``PROPOSED + b^2 * GOLD``; if still tied the annotator seen first (lowest
id) wins.  Comparisons are done with exact fractions, not floats.

Final scores
------------
``P = TP/PROPOSED`` (1.0 when nothing is proposed), ``R = TP/GOLD`` (1.0 when
there is no gold edit), ``F = (1+b^2) P R / (b^2 P + R)`` (0.0 when the
denominator is 0) -- the official conventions.  So an all-copy system on a
corpus with gold edits gets P=1.0, R=0.0, F=0.0, and a copy system on a
noop-only corpus gets P=R=F=1.0.

Known, deliberate differences from the official script (all corner cases):
insertions at the very start of the sentence are located at source offset 0
(the official code gives the k-th inserted token offset k-1); gold
corrections are whitespace-normalised; a system edit can match at most one
gold edit and gold edits are matched irrespective of their order in the
file; ties between paths of equal weight are broken deterministically
(see step 3) rather than by Bellman-Ford edge order; the existence of a
merged edge only requires *some* lattice path with at most
``max_unchanged_words`` unchanged words (the official Floyd-Warshall pass
checks only the first shortest path it builds).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Tokens = Tuple[str, ...]


class M2FormatError(ValueError):
    """Raised for a malformed M2 file."""


@dataclass(frozen=True)
class Edit:
    """A gold (or system) edit on token offsets ``[start, end)``.

    ``correction`` holds the tokens of the first alternative, ``alternatives``
    all of them (``(correction,)`` when the M2 line has a single one).
    """

    start: int
    end: int
    correction: Tokens
    type: str = ""
    alternatives: Tuple[Tokens, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "correction", tuple(self.correction))
        alts = tuple(tuple(a) for a in self.alternatives) or (self.correction,)
        object.__setattr__(self, "alternatives", alts)


@dataclass
class M2Sentence:
    source: List[str]
    # annotator id -> edits (noop-only annotators map to an empty list)
    edits: Dict[int, List[Edit]] = field(default_factory=dict)


# --------------------------------------------------------------------------
# M2 parsing / writing
# --------------------------------------------------------------------------


def _parse_a_line(line: str, source: Sequence[str], lineno: int):
    body = line[2:]
    fields = body.split("|||")
    if len(fields) < 3:
        raise M2FormatError(f"line {lineno}: expected 'A start end|||type|||correction|||...': {line!r}")
    span = fields[0].split()
    if len(span) != 2:
        raise M2FormatError(f"line {lineno}: bad edit span {fields[0]!r}")
    try:
        start, end = int(span[0]), int(span[1])
    except ValueError:
        raise M2FormatError(f"line {lineno}: bad edit span {fields[0]!r}") from None
    etype = fields[1].strip()
    annotator = 0
    if len(fields) >= 6:
        try:
            annotator = int(fields[5].strip())
        except ValueError:
            raise M2FormatError(f"line {lineno}: bad annotator id {fields[5]!r}") from None
    if etype.lower() == "noop" or start < 0 or end < 0:
        return annotator, None
    if not (0 <= start <= end <= len(source)):
        raise M2FormatError(
            f"line {lineno}: edit span {start} {end} outside the sentence of {len(source)} tokens"
        )
    alts = []
    for c in fields[2].split("||"):
        c = c.strip()
        alts.append(() if c == "-NONE-" else tuple(c.split()))
    return annotator, Edit(start, end, alts[0], etype, tuple(alts))


def parse_m2(lines: Iterable[str]) -> List[M2Sentence]:
    """Parse M2 text (an iterable of lines) into :class:`M2Sentence` objects."""
    sentences: List[M2Sentence] = []
    cur: Optional[M2Sentence] = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            cur = None
            continue
        if line == "S" or line.startswith("S "):
            if cur is not None:
                raise M2FormatError(f"line {lineno}: second 'S' line in one block (missing blank line?)")
            cur = M2Sentence(source=line[2:].split(), edits={})
            sentences.append(cur)
        elif line.startswith("A "):
            if cur is None:
                raise M2FormatError(f"line {lineno}: 'A' line without a preceding 'S' line")
            annotator, edit = _parse_a_line(line, cur.source, lineno)
            lst = cur.edits.setdefault(annotator, [])
            if edit is not None:
                lst.append(edit)
        else:
            raise M2FormatError(f"line {lineno}: expected an 'S ' or 'A ' line, got {line[:60]!r}")
    for s in sentences:
        if not s.edits:
            s.edits[0] = []
    return sentences


def read_m2(path: str) -> List[M2Sentence]:
    with open(path, encoding="utf-8") as f:
        return parse_m2(f)


def format_edit(edit: Edit, annotator: int = 0) -> str:
    corr = "||".join(" ".join(a) for a in edit.alternatives)
    return f"A {edit.start} {edit.end}|||{edit.type or 'OTHER'}|||{corr}|||REQUIRED|||-NONE-|||{annotator}"


def noop_line(annotator: int = 0) -> str:
    return f"A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||{annotator}"


def apply_edits(source_tokens: Sequence[str], edits: Iterable[Edit]) -> List[str]:
    """Apply (non-overlapping) edits to ``source_tokens``.

    Edits are applied in (start, end) order; insertions at the same offset
    keep their given order.  Noop edits (negative offsets) are ignored.
    """
    valid = sorted((e for e in edits if e.start >= 0), key=lambda e: (e.start, e.end))
    out: List[str] = []
    pos = 0
    for e in valid:
        if e.start < pos or e.end > len(source_tokens):
            raise ValueError(f"overlapping or out-of-range edit {e}")
        out.extend(source_tokens[pos : e.start])
        out.extend(e.correction)
        pos = e.end
    out.extend(source_tokens[pos:])
    return out


# --------------------------------------------------------------------------
# Lattice and best edit sequence
# --------------------------------------------------------------------------

Node = Tuple[int, int]


def distance_table(src: Sequence[str], hyp: Sequence[str], sub_cost: int = 1) -> List[List[int]]:
    """Levenshtein table: ``d[i][j]`` = edits turning ``src[:i]`` into ``hyp[:j]`` (insertion and
    deletion cost 1, substitution ``sub_cost``)."""
    n, m = len(src), len(hyp)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        row, prev = d[i], d[i - 1]
        si = src[i - 1]
        for j in range(1, m + 1):
            diag = prev[j - 1] + (0 if si == hyp[j - 1] else sub_cost)
            row[j] = min(diag, prev[j] + 1, row[j - 1] + 1)
    return d


def _lattice(src: Sequence[str], hyp: Sequence[str]) -> Dict[Node, List[Tuple[Node, bool]]]:
    """Union of optimal-alignment lattices (sub cost 1 and 2).

    Returns ``succ[u] = [(v, changed), ...]`` over all lattice vertices.
    """
    n, m = len(src), len(hyp)
    succ: Dict[Node, set] = {}
    for sub_cost in (1, 2):
        d = distance_table(src, hyp, sub_cost)
        stack = [(n, m)]
        seen = {(n, m)}
        succ.setdefault((n, m), set())
        while stack:
            i, j = stack.pop()
            preds = []
            if i > 0 and j > 0:
                same = src[i - 1] == hyp[j - 1]
                if d[i - 1][j - 1] + (0 if same else sub_cost) == d[i][j]:
                    preds.append(((i - 1, j - 1), not same))
            if i > 0 and d[i - 1][j] + 1 == d[i][j]:
                preds.append(((i - 1, j), True))
            if j > 0 and d[i][j - 1] + 1 == d[i][j]:
                preds.append(((i, j - 1), True))
            for p, changed in preds:
                succ.setdefault(p, set()).add(((i, j), changed))
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
    return {u: sorted(vs) for u, vs in succ.items()}


def _edge_possible(succ, u: Node, v: Node, max_unchanged: int) -> bool:
    """Is there a lattice path u -> v with >=1 changed step and
    <= max_unchanged unchanged steps?"""
    stack = [(u, 0, False)]
    seen = set(stack)
    while stack:
        node, k, ch = stack.pop()
        if node == v and ch:
            return True
        for w, changed in succ.get(node, ()):
            if w[0] > v[0] or w[1] > v[1]:
                continue
            nk = k if changed else k + 1
            if nk > max_unchanged:
                continue
            st = (w, nk, ch or changed)
            if st not in seen:
                seen.add(st)
                stack.append(st)
    return False


@dataclass(frozen=True)
class SysEdit:
    start: int
    end: int
    original: Tokens
    correction: Tokens


def _gold_matches(e: SysEdit, g: Edit) -> bool:
    return e.start == g.start and e.end == g.end and e.correction in g.alternatives


def best_edit_sequence(
    src: Sequence[str],
    hyp: Sequence[str],
    gold: Sequence[Edit],
    max_unchanged_words: int = 2,
    succ=None,
) -> List[SysEdit]:
    """System edits of the lattice path that maximally matches ``gold``."""
    src, hyp = list(src), list(hyp)
    if succ is None:
        succ = _lattice(src, hyp)
    K = max_unchanged_words
    nodes = sorted(succ)  # lexicographic (i, j) order is topological
    final = (len(src), len(hyp))

    # gold edges: u -> v whose edit equals a gold edit
    gold_succ: Dict[Node, List[Node]] = {}
    by_row: Dict[int, List[Node]] = {}
    for u in nodes:
        by_row.setdefault(u[0], []).append(u)
    for g in gold:
        for u in by_row.get(g.start, ()):
            for alt in g.alternatives:
                v = (g.end, u[1] + len(alt))
                if v not in succ or tuple(hyp[u[1] : v[1]]) != alt or v == u:
                    continue
                if v in gold_succ.get(u, ()):
                    continue
                if _edge_possible(succ, u, v, K):
                    gold_succ.setdefault(u, []).append(v)

    # DP states: ("O", node) outside an edit; ("I", node, k, changed) inside
    # an open non-gold edit (k unchanged words so far, changed: has it seen a
    # changed step yet).  Where the edit began is recovered by backtracking.
    best: Dict[tuple, Tuple[tuple, Optional[tuple], str]] = {}

    def relax(state, cost, prev, action):
        old = best.get(state)
        if old is None or cost < old[0]:
            best[state] = (cost, prev, action)

    def add(cost, dg=0, ds=0, de=0, dk=0):
        return (cost[0] - dg, cost[1] + ds, cost[2] + de, cost[3] + dk)

    relax(("O", (0, 0)), (0, 0, 0, 0), None, "start")
    inside_at: Dict[Node, List[tuple]] = {}
    for u in nodes:
        # close open edits ending here
        for st in inside_at.get(u, ()):
            if st[3] and st in best:
                relax(("O", u), best[st][0], st, "close")
        out = ("O", u)
        if out in best:
            c = best[out][0]
            for v in gold_succ.get(u, ()):
                relax(("O", v), add(c, dg=1), out, "gold")
            for v, changed in succ[u]:
                if not changed:
                    relax(("O", v), add(c, ds=1), out, "keep")
            # open a new non-gold edit at u
            open_st = ("I", u, 0, False)
            relax(open_st, add(c, de=1), out, "open")
            inside_at.setdefault(u, []).append(open_st)
        for st in inside_at.get(u, ()):
            if st not in best:
                continue
            _, _, k, ch = st
            c = best[st][0]
            for v, changed in succ[u]:
                nk = k if changed else k + 1
                if nk > K:
                    continue
                nst = ("I", v, nk, ch or changed)
                if nst not in best:
                    inside_at.setdefault(v, []).append(nst)
                relax(nst, add(c, ds=1, dk=0 if changed else 1), st, "step")
    if ("O", final) not in best:  # cannot happen: plain steps always reach the end
        raise RuntimeError("no path through the edit lattice")

    # backtrack
    edits: List[SysEdit] = []
    st = ("O", final)
    end_of_open: Optional[Node] = None
    while True:
        cost, prev, action = best[st]
        if action == "start":
            break
        if action == "gold":
            u, v = prev[1], st[1]
            edits.append(SysEdit(u[0], v[0], tuple(src[u[0] : v[0]]), tuple(hyp[u[1] : v[1]])))
        elif action == "close":
            end_of_open = st[1]
        elif action == "open":
            u, v = st[1], end_of_open
            edits.append(SysEdit(u[0], v[0], tuple(src[u[0] : v[0]]), tuple(hyp[u[1] : v[1]])))
            end_of_open = None
        st = prev
    edits.reverse()
    return edits


def _equal_ignore_ws_case(a: Sequence[str], b: Sequence[str]) -> bool:
    return "".join(a).lower() == "".join(b).lower()


def count_matches(sys_edits: Sequence[SysEdit], gold: Sequence[Edit]) -> int:
    used = [False] * len(gold)
    tp = 0
    for e in sys_edits:
        for idx, g in enumerate(gold):
            if not used[idx] and _gold_matches(e, g):
                used[idx] = True
                tp += 1
                break
    return tp


# --------------------------------------------------------------------------
# Corpus scoring
# --------------------------------------------------------------------------


def _f_counts(c, e, g, b2: Fraction) -> Fraction:
    denom = b2 * g + e
    if denom == 0:
        return Fraction(1)
    return (1 + b2) * c / denom


@dataclass
class SentenceResult:
    annotator: int
    tp: int
    proposed: int
    gold: int
    system_edits: List[SysEdit]


@dataclass
class M2Result:
    precision: float
    recall: float
    f: float
    tp: int
    proposed: int
    gold: int
    beta: float
    sentences: List[SentenceResult]


def final_scores(tp: int, proposed: int, gold: int, beta: float) -> Tuple[float, float, float]:
    p = tp / proposed if proposed else 1.0
    r = tp / gold if gold else 1.0
    b2 = beta * beta
    denom = b2 * p + r
    f = (1.0 + b2) * p * r / denom if denom else 0.0
    return p, r, f


def score_sentence_all_annotators(
    hyp: Sequence[str],
    sentence: M2Sentence,
    max_unchanged_words: int = 2,
    ignore_whitespace_casing: bool = False,
) -> List[Tuple[int, int, int, int, List[SysEdit]]]:
    """(annotator, tp, proposed, gold, system edits) for each annotator."""
    succ = _lattice(sentence.source, hyp)
    out = []
    for ann in sorted(sentence.edits):
        gold = sentence.edits[ann]
        sys_edits = best_edit_sequence(sentence.source, hyp, gold, max_unchanged_words, succ)
        if ignore_whitespace_casing:
            sys_edits = [e for e in sys_edits if not _equal_ignore_ws_case(e.original, e.correction)]
        tp = count_matches(sys_edits, gold)
        out.append((ann, tp, len(sys_edits), len(gold), sys_edits))
    return out


def score_m2(
    hypotheses: Sequence[str],
    sentences: Sequence[M2Sentence],
    beta: float = 0.5,
    max_unchanged_words: int = 2,
    ignore_whitespace_casing: bool = False,
) -> M2Result:
    """Score system output lines against parsed M2 gold sentences."""
    if len(hypotheses) != len(sentences):
        raise ValueError(
            f"system output has {len(hypotheses)} lines but the M2 file has {len(sentences)} sentences"
        )
    b2 = Fraction(beta) ** 2
    tot_c = tot_e = tot_g = 0
    per_sentence: List[SentenceResult] = []
    for hyp_line, sent in zip(hypotheses, sentences):
        hyp = hyp_line.split()
        best = None
        for ann, c, e, g, sys_edits in score_sentence_all_annotators(
            hyp, sent, max_unchanged_words, ignore_whitespace_casing
        ):
            rc, re_, rg = tot_c + c, tot_e + e, tot_g + g
            f = _f_counts(rc, re_, rg, b2)
            if (
                best is None
                or f > best[0]
                or (f == best[0] and rc > best[1])
                or (f == best[0] and rc == best[1] and re_ + b2 * rg < best[2] + b2 * best[3])
            ):
                best = (f, rc, re_, rg, SentenceResult(ann, c, e, g, sys_edits))
        res = best[4]
        per_sentence.append(res)
        tot_c += res.tp
        tot_e += res.proposed
        tot_g += res.gold
    p, r, f = final_scores(tot_c, tot_e, tot_g, beta)
    return M2Result(p, r, f, tot_c, tot_e, tot_g, beta, per_sentence)


def format_result(result: M2Result) -> str:
    return (
        f"Precision   : {result.precision:.4f}\n"
        f"Recall      : {result.recall:.4f}\n"
        f"F_{result.beta}       : {result.f:.4f}"
    )


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


class _CliError(Exception):
    pass


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise _CliError(f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _CliError(f"cannot read {path}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairseq-aggressive-m2",
        description="MaxMatch (M2) scorer for grammatical error correction "
        "(defaults of the official m2scorer).",
    )
    p.add_argument("system_output", help="tokenized system output, one sentence per line")
    p.add_argument("gold_m2", help="gold annotations in M2 format")
    p.add_argument("--beta", type=float, default=0.5, help="F-measure beta (default 0.5)")
    p.add_argument(
        "--max-unchanged-words", "--max_unchanged_words", dest="max_unchanged_words",
        type=int, default=2, help="max unchanged words inside one merged edit (default 2)",
    )
    p.add_argument(
        "--ignore-whitespace-casing", "--ignore_whitespace_casing", dest="ignore_whitespace_casing",
        action="store_true", help="ignore edits that only change casing or whitespace",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print per-sentence details")
    return p


def _print_verbose(hyps, sentences, result):
    for idx, (h, s, r) in enumerate(zip(hyps, sentences, result.sentences), 1):
        print(f"SOURCE        : {' '.join(s.source)}")
        print(f"HYPOTHESIS    : {h.strip()}")
        print("EDIT SEQ      : " + repr([(e.start, e.end, " ".join(e.original), " ".join(e.correction)) for e in r.system_edits]))
        gold = s.edits.get(r.annotator, [])
        print("GOLD EDITS    : " + repr([(g.start, g.end, [" ".join(a) for a in g.alternatives]) for g in gold]))
        print(f"# correct     : {r.tp}")
        print(f"# proposed    : {r.proposed}")
        print(f"# gold        : {r.gold}")
        print(f">> Chosen Annotator for line {idx} : {r.annotator}")
        print("-------------------------------------------")
    print(f"CORRECT EDITS  : {result.tp}")
    print(f"PROPOSED EDITS : {result.proposed}")
    print(f"GOLD EDITS     : {result.gold}")


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        if args.beta < 0:
            raise _CliError("--beta must be >= 0")
        if args.max_unchanged_words < 0:
            raise _CliError("--max-unchanged-words must be >= 0")
        hyps = _read_lines(args.system_output)
        if not os.path.exists(args.gold_m2):
            raise _CliError(f"file not found: {args.gold_m2}")
        try:
            sentences = parse_m2(_read_lines(args.gold_m2))
        except M2FormatError as exc:
            raise _CliError(f"malformed M2 file {args.gold_m2}: {exc}") from None
        if len(hyps) != len(sentences):
            raise _CliError(
                f"{args.system_output} has {len(hyps)} lines but {args.gold_m2} has "
                f"{len(sentences)} sentences"
            )
        result = score_m2(hyps, sentences, args.beta, args.max_unchanged_words, args.ignore_whitespace_casing)
    except _CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.verbose:
        _print_verbose(hyps, sentences, result)
    print(format_result(result))
    return 0


def main() -> None:  # console-script entry point
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
