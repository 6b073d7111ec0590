"""Build gold M2 annotations from parallel (source, corrected) text.

    python -m fairseq_aggressive.evaluation.parallel_to_m2 SRC TGT -o GOLD.m2

Both files are whitespace-tokenized, one sentence per line.  Each pair is
aligned with a token-level Levenshtein alignment (unit costs; on ties a
match/substitution is preferred over a deletion, a deletion over an
insertion) and every maximal run of adjacent changed alignment steps becomes
one edit (type ``R:OTHER`` replacement, ``M:OTHER`` insertion, ``U:OTHER``
deletion; annotator 0).  Identical sentences get a single noop line
``A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0``.  Applying the edits to
the source gives back exactly the target tokens.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from .m2 import Edit, distance_table, format_edit, noop_line
from . import read_lines


def align_edits(src: Sequence[str], tgt: Sequence[str]) -> List[Edit]:
    """Minimal token-level edits turning ``src`` into ``tgt``."""
    n, m = len(src), len(tgt)
    d = distance_table(src, tgt)
    # backtrace: list of steps (i_before, j_before, changed)
    steps = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + (src[i - 1] != tgt[j - 1]):
            steps.append((i - 1, j - 1, i, j, src[i - 1] != tgt[j - 1]))
            i, j = i - 1, j - 1
        elif i > 0 and d[i][j] == d[i - 1][j] + 1:
            steps.append((i - 1, j, i, j, True))
            i -= 1
        else:
            steps.append((i, j - 1, i, j, True))
            j -= 1
    steps.reverse()
    edits: List[Edit] = []
    run = None  # [i0, j0, i1, j1]
    for i0, j0, i1, j1, changed in steps + [(n, m, n, m, False)]:
        if changed:
            if run is None:
                run = [i0, j0, i1, j1]
            else:
                run[2], run[3] = i1, j1
        elif run is not None:
            a, b, c, e = run
            if c == a:
                etype = "M:OTHER"
            elif e == b:
                etype = "U:OTHER"
            else:
                etype = "R:OTHER"
            edits.append(Edit(a, c, tuple(tgt[b:e]), etype))
            run = None
    return edits


def m2_block(src: Sequence[str], tgt: Sequence[str], annotator: int = 0) -> str:
    lines = ["S " + " ".join(src)]
    edits = align_edits(src, tgt)
    if edits:
        lines.extend(format_edit(e, annotator) for e in edits)
    else:
        lines.append(noop_line(annotator))
    return "\n".join(lines) + "\n"


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fairseq_aggressive.evaluation.parallel_to_m2",
        description="Build minimal token-level M2 gold edits from parallel text.",
    )
    p.add_argument("src", help="tokenized source sentences, one per line")
    p.add_argument("tgt", help="tokenized corrected sentences, one per line")
    p.add_argument("-o", "--output", required=True, help="output M2 file ('-' for stdout)")
    p.add_argument("--annotator", type=int, default=0, help="annotator id to write (default 0)")
    args = p.parse_args(argv)
    try:
        src, tgt = read_lines(args.src), read_lines(args.tgt)
    except OSError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    if len(src) != len(tgt):
        print(f"{p.prog}: error: {args.src} has {len(src)} lines but {args.tgt} has {len(tgt)}", file=sys.stderr)
        return 2
    blocks = [m2_block(s.split(), t.split(), args.annotator) for s, t in zip(src, tgt)]
    text = "\n".join(blocks)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
