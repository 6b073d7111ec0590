"""Extract parallel (source, corrected) text from an M2 file.

    python -m fairseq_aggressive.evaluation.m2_to_parallel GOLD.m2 --annotator 0 \\
        --src OUT.src --tgt OUT.tgt

The target is the source with the chosen annotator's edits applied (first
alternative of each correction).  Sentences the annotator did not annotate
are copied unchanged (source == target) unless ``--skip-missing`` is given,
in which case they are left out of both outputs.  Sentences with a noop
annotation are copied unchanged.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .m2 import M2FormatError, apply_edits, read_m2


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fairseq_aggressive.evaluation.m2_to_parallel",
        description="Apply one annotator's M2 edits to get parallel training text.",
    )
    p.add_argument("m2", help="input M2 file")
    p.add_argument("--annotator", type=int, default=0, help="annotator id (default 0)")
    p.add_argument("--src", required=True, help="output source file")
    p.add_argument("--tgt", required=True, help="output corrected file")
    p.add_argument(
        "--skip-missing", action="store_true",
        help="drop sentences the annotator did not annotate (default: copy them unchanged)",
    )
    args = p.parse_args(argv)
    try:
        sentences = read_m2(args.m2)
    except (OSError, M2FormatError) as exc:
        print(f"{p.prog}: error: {args.m2}: {exc}", file=sys.stderr)
        return 2
    n_written = 0
    with open(args.src, "w", encoding="utf-8") as fs, open(args.tgt, "w", encoding="utf-8") as ft:
        for k, sent in enumerate(sentences, 1):
            if args.annotator not in sent.edits:
                if args.skip_missing:
                    continue
                edits = []
            else:
                edits = sent.edits[args.annotator]
            try:
                tgt = apply_edits(sent.source, edits)
            except ValueError as exc:
                print(f"{p.prog}: error: sentence {k}: {exc}", file=sys.stderr)
                return 2
            fs.write(" ".join(sent.source) + "\n")
            ft.write(" ".join(tgt) + "\n")
            n_written += 1
    print(f"wrote {n_written} sentence pairs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
