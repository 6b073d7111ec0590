"""ERRANT (BEA-2019) evaluation wrapper -- optional, needs the ``gec`` extra.

    python -m fairseq_aggressive.evaluation.errant_eval \\
        --orig SRC --hyp HYP --ref REF.m2 --spacy-model en_core_web_sm [--out-m2 HYP.m2] \\
        [extra errant_compare options, e.g. -cat 3 -ds -cs -b 0.5]

ERRANT's own ``errant_parallel`` hard-codes ``spacy.load("en_core_web_sm")``;
here the spaCy pipeline is loaded explicitly from ``--spacy-model`` (a package
name or a path to a model directory) and handed to ``errant.load("en", nlp)``.
The hypothesis M2 is written with annotator id 0 (one block per input line,
noop for unchanged or empty lines, so the block count always matches the
reference), then ERRANT's ``compare_m2`` command is run on it.  Options not
recognised here are passed through to ``compare_m2``.

``--spacy-model blank:en`` uses an empty ``spacy.blank("en")`` pipeline: it
only exercises the wiring (no tagger/parser, so error types are meaningless).

Install: ``pip install 'fairseq-aggressive[gec]'`` (errant pulls in spaCy,
~235 MB with its dependencies) and, on a machine with internet,
``python -m spacy download en_core_web_sm``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import List, Optional, Sequence

NOOP = "A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0"


class ErrantSetupError(RuntimeError):
    pass


def _register_dummy_tagger() -> str:
    """A component giving every token tag NN / POS NOUN / lemma = lower case,
    so ERRANT's classifier runs on a blank pipeline (wiring tests only)."""
    from spacy.language import Language

    name = "fairseq_aggressive_dummy_tagger"
    if not Language.has_factory(name):

        def dummy_tagger(doc):
            for tok in doc:
                tok.tag_ = "NN"
                tok.pos_ = "NOUN"
                tok.lemma_ = tok.lower_
                tok.dep_ = "dep"
            return doc

        Language.component(name, func=dummy_tagger)
    return name


def load_annotator(spacy_model: str):
    try:
        import errant
        import spacy
    except ImportError as exc:
        raise ErrantSetupError(
            f"ERRANT is not installed ({exc}). Install the optional extra: "
            "pip install 'fairseq-aggressive[gec]'"
        ) from None
    if spacy_model.startswith("blank:"):
        nlp = spacy.blank(spacy_model.split(":", 1)[1])
        nlp.add_pipe(_register_dummy_tagger())
    else:
        try:
            nlp = spacy.load(spacy_model, disable=["ner"])
        except OSError as exc:
            raise ErrantSetupError(
                f"cannot load the spaCy model {spacy_model!r} ({exc}).\n"
                "Install it on a machine with internet access with\n"
                "    python -m spacy download en_core_web_sm\n"
                "(or copy a model directory and pass its path with --spacy-model)."
            ) from None
    return errant.load("en", nlp)


def hypothesis_m2(annotator, orig_lines: Sequence[str], hyp_lines: Sequence[str], tokenise: bool = False,
                  lev: bool = False, merge: str = "rules") -> str:
    blocks: List[str] = []
    for orig, hyp in zip(orig_lines, hyp_lines):
        orig, hyp = orig.strip(), hyp.strip()
        if not orig:
            blocks.append("S \n" + NOOP)
            continue
        orig_doc = annotator.parse(orig, tokenise)
        lines = [" ".join(["S"] + [t.text for t in orig_doc])]
        edits = []
        if orig_doc.text.strip() != hyp:
            edits = annotator.annotate(orig_doc, annotator.parse(hyp, tokenise), lev, merge)
        lines.extend(e.to_m2(0) for e in edits)
        if not edits:
            lines.append(NOOP)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _count_blocks(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return len([b for b in f.read().strip().split("\n\n") if b.strip()])


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fairseq_aggressive.evaluation.errant_eval",
        description="ERRANT (BEA-19) evaluation with an explicitly loaded spaCy model.",
    )
    p.add_argument("--orig", required=True, help="original (source) sentences, tokenized")
    p.add_argument("--hyp", required=True, help="system output, tokenized")
    p.add_argument("--ref", required=True, help="reference M2 file")
    p.add_argument("--spacy-model", default="en_core_web_sm",
                   help="spaCy model name or path (default en_core_web_sm); 'blank:en' for wiring tests")
    p.add_argument("--out-m2", default=None, help="where to write the hypothesis M2 (default HYP.m2)")
    p.add_argument("--tok", action="store_true", help="word-tokenise the input with spaCy first")
    p.add_argument("--lev", action="store_true", help="standard Levenshtein alignment")
    p.add_argument("--merge", default="rules", choices=["rules", "all-split", "all-merge", "all-equal"])
    args, compare_args = p.parse_known_args(argv)
    out_m2 = args.out_m2 or args.hyp + ".m2"
    try:
        with open(args.orig, encoding="utf-8") as f:
            orig = f.read().splitlines()
        with open(args.hyp, encoding="utf-8") as f:
            hyp = f.read().splitlines()
        if len(orig) != len(hyp):
            raise ErrantSetupError(f"{args.orig} has {len(orig)} lines but {args.hyp} has {len(hyp)}")
        n_ref = _count_blocks(args.ref)
        if n_ref != len(orig):
            raise ErrantSetupError(f"{args.ref} has {n_ref} sentences but {args.orig} has {len(orig)} lines")
        annotator = load_annotator(args.spacy_model)
    except (OSError, ErrantSetupError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    with open(out_m2, "w", encoding="utf-8") as f:
        f.write(hypothesis_m2(annotator, orig, hyp, args.tok, args.lev, args.merge))
    cmd = [sys.executable, "-m", "errant.commands.compare_m2", "-hyp", out_m2, "-ref", args.ref, *compare_args]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(cli_main())
