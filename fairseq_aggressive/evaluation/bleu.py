"""BLEU for MT outputs via sacreBLEU.

    fairseq-aggressive-bleu HYP REF [REF ...] [--tokenized] [--compound-split]

* default: detokenized sacreBLEU (``13a`` tokenizer), the comparable score.
* ``--tokenized``: BLEU on already tokenized text (``tokenize='none'``).
* ``--compound-split``: the conventional WMT14 EN-DE "compound-split
  tokenized BLEU": on both sides every hyphen between two non-space
  characters becomes `` ##AT##-##AT## `` (the substitution
  ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` of the usual scripts, including its
  non-overlapping behaviour: ``a-b-c`` -> ``a ##AT##-##AT## b-c``), then
  BLEU with ``tokenize='none'`` (implies ``--tokenized``).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Optional, Sequence
from . import read_lines

_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def corpus_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]], tokenized: bool = False, compound: bool = False):
    """Return a sacrebleu ``BLEUScore``; ``refs[k]`` are the lines of reference k."""
    from sacrebleu.metrics import BLEU

    if compound:
        hyps = [compound_split(h) for h in hyps]
        refs = [[compound_split(r) for r in ref] for ref in refs]
        tokenized = True
    bleu = BLEU(tokenize="none" if tokenized else "13a")
    return bleu.corpus_score(list(hyps), [list(r) for r in refs])


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="fairseq-aggressive-bleu", description=__doc__.split("\n\n")[0])
    p.add_argument("hyp", help="system output, one sentence per line")
    p.add_argument("ref", nargs="+", help="reference file(s)")
    p.add_argument("--tokenized", action="store_true", help="text is already tokenized (tokenize='none')")
    p.add_argument("--compound-split", action="store_true", help="WMT14 EN-DE compound-split tokenized BLEU")
    args = p.parse_args(argv)
    try:
        hyps = read_lines(args.hyp)
        refs = [read_lines(r) for r in args.ref]
    except OSError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    for path, r in zip(args.ref, refs):
        if len(r) != len(hyps):
            print(f"{p.prog}: error: {args.hyp} has {len(hyps)} lines but {path} has {len(r)}", file=sys.stderr)
            return 2
    print(corpus_bleu(hyps, refs, args.tokenized, args.compound_split))
    return 0


def main() -> None:
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
