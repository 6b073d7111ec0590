"""BLEU wrapper (fairseq_aggressive.evaluation.bleu)."""
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_aggressive.evaluation.bleu import compound_split, corpus_bleu


def test_compound_split_crafted_line():
    line = "ein well-known state-of-the-art Modell , a-b-c und - allein"
    assert compound_split(line) == (
        "ein well ##AT##-##AT## known state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art "
        "Modell , a ##AT##-##AT## b-c und - allein"
    )


def test_identical_is_100():
    hyps = ["Das ist ein well-known Test .", "Noch ein Satz hier ."]
    assert corpus_bleu(hyps, [hyps]).score == pytest.approx(100.0)
    assert corpus_bleu(hyps, [hyps], tokenized=True).score == pytest.approx(100.0)
    assert corpus_bleu(hyps, [hyps], compound=True).score == pytest.approx(100.0)


def test_compound_split_changes_ngram_counts():
    # hyp gets the compound wrong; with splitting the matching halves still count
    hyp = ["a b c d e well-done"]
    ref = ["a b c d e well-known"]
    plain = corpus_bleu(hyp, [ref], tokenized=True)
    split = corpus_bleu(hyp, [ref], compound=True)
    # tokenized: 5/6 unigrams, 4/5, 3/4, 2/3 ; split: 7/8, 6/7, 5/6, 4/5 (8 tokens each: ... well ##AT##-##AT## done)
    assert plain.score == pytest.approx(100 * (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25, abs=1e-6)
    assert split.score == pytest.approx(100 * (7 / 8 * 6 / 7 * 5 / 6 * 4 / 5) ** 0.25, abs=1e-6)


def test_cli(tmp_path):
    h, r = tmp_path / "h", tmp_path / "r"
    h.write_text("a b c d e well-done\n")
    r.write_text("a b c d e well-known\n")
    exe = Path(sys.executable).parent / "fairseq-aggressive-bleu"
    p = subprocess.run([str(exe), str(h), str(r), "--compound-split"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("BLEU = 84.09 ")  # = split score above
