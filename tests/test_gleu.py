"""GLEU (fairseq_aggressive.evaluation.gleu) against hand-computed values."""
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_aggressive.evaluation.gleu import corpus_gleu, corpus_gleu_iterations, sentence_stats

SRC = "a b c d e f"
REF = "a b c d e g"


def test_identical_hypothesis_and_reference_is_one():
    assert corpus_gleu([SRC], [[REF]], [REF]) == pytest.approx(1.0)


def test_hand_computed_source_copy():
    # hyp == source; the source-only n-grams (f, "e f", "d e f", "c d e f") are penalised:
    # p1 = (5-1)/6, p2 = (4-1)/5, p3 = (3-1)/4, p4 = (2-1)/3, BP = 1
    assert sentence_stats(SRC.split(), SRC.split(), REF.split()) == [6, 6, 4, 6, 3, 5, 2, 4, 1, 3]
    expected = (4 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25  # (1/15)^(1/4) = 0.50813
    assert corpus_gleu([SRC], [[REF]], [SRC]) == pytest.approx(expected)
    assert expected == pytest.approx(0.508133, abs=1e-6)


def test_source_copy_scores_lower_than_correct_and_wrong_fix():
    copy = corpus_gleu([SRC], [[REF]], [SRC])
    wrong = corpus_gleu([SRC], [[REF]], ["a b c d e h"])  # (5/6*4/5*3/4*2/3)^(1/4)
    assert wrong == pytest.approx((1 / 3) ** 0.25)
    assert copy < wrong < corpus_gleu([SRC], [[REF]], [REF])


def test_brevity_penalty():
    # hyp "a b c d e": all n-grams match, no penalty; BP = exp(1 - 6/5)
    assert corpus_gleu([SRC], [[REF]], ["a b c d e"]) == pytest.approx(math.exp(-0.2))


def test_corpus_level_sums_statistics():
    # two sentences: stats add up before the geometric mean
    s = corpus_gleu([SRC, SRC], [[REF, REF]], [SRC, REF])
    p = (4 + 6) / 12 * (3 + 5) / 10 * (2 + 4) / 8 * (1 + 3) / 6
    assert s == pytest.approx(p ** 0.25)


def test_zero_when_a_precision_is_zero():
    assert corpus_gleu(["a b c"], [["a b d"]], ["x y z"]) == 0.0


def test_multiple_references_deterministic():
    refs = [[REF], [SRC]]  # second reference says the source is already correct
    scores = corpus_gleu_iterations([SRC], refs, [SRC], iterations=50)
    # each iteration uses one reference: either the copy-penalised score or 1.0
    assert all(s == pytest.approx(1.0) or s == pytest.approx((1 / 15) ** 0.25) for s in scores)
    assert 0 < sum(s == 1.0 for s in scores) < 50  # both references get drawn
    assert scores == corpus_gleu_iterations([SRC], refs, [SRC], iterations=50)
    # identical references reduce to the single-reference score
    assert corpus_gleu([SRC], [[REF], [REF]], [SRC], iterations=20) == pytest.approx((1 / 15) ** 0.25)


def test_cli(tmp_path):
    s, r, h = tmp_path / "s", tmp_path / "r", tmp_path / "h"
    s.write_text(SRC + "\n")
    r.write_text(REF + "\n")
    h.write_text(SRC + "\n")
    exe = Path(sys.executable).parent / "fairseq-aggressive-gleu"
    p = subprocess.run([str(exe), "-s", str(s), "-r", str(r), "-o", str(h)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "0.508133\n"
