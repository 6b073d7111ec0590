"""MaxMatch (M2) scorer: hand-computed cases (fairseq_aggressive.evaluation.m2)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_aggressive.evaluation import m2_to_parallel, parallel_to_m2
from fairseq_aggressive.evaluation.m2 import Edit, apply_edits, cli_main, parse_m2, read_m2, score_m2

BIN = Path(sys.executable).parent


def score(m2_text, hyps, **kw):
    return score_m2(hyps, parse_m2(m2_text.splitlines()), **kw)


def prf(r):
    return (r.tp, r.proposed, r.gold, r.precision, r.recall, r.f)


TWO = """S This are a sentence .
A 1 2|||R:VERB:SVA|||is|||REQUIRED|||-NONE-|||0

S He go to school yesterday .
A 1 2|||R:VERB:TENSE|||went|||REQUIRED|||-NONE-|||0
A 4 5|||U:ADV||||||REQUIRED|||-NONE-|||0
"""


# ------------------------------------------------------------------ parsing


def test_parse_m2_structure():
    text = TWO + """
S a b c
A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0
A 1 2|||R:OTHER|||x||y z|||REQUIRED|||-NONE-|||1
A 3 3|||M:OTHER|||d|||REQUIRED|||-NONE-|||1
A 0 1|||U:OTHER|||-NONE-|||REQUIRED|||-NONE-|||1

S no annotation at all
"""
    s = parse_m2(text.splitlines())
    assert len(s) == 4
    assert s[0].source == ["This", "are", "a", "sentence", "."]
    assert s[0].edits == {0: [Edit(1, 2, ("is",), "R:VERB:SVA")]}
    assert s[1].edits[0][1] == Edit(4, 5, (), "U:ADV")
    assert s[2].edits[0] == []  # noop-only annotator present, no edits
    e1 = s[2].edits[1]
    assert e1[0].correction == ("x",) and e1[0].alternatives == (("x",), ("y", "z"))
    assert (e1[1].start, e1[1].end, e1[1].correction) == (3, 3, ("d",))
    assert e1[2].correction == ()  # -NONE- -> deletion
    assert s[3].edits == {0: []}


def test_read_m2_and_apply_edits(tmp_path):
    p = tmp_path / "g.m2"
    p.write_text(TWO, encoding="utf-8")
    s = read_m2(str(p))
    assert apply_edits(s[0].source, s[0].edits[0]) == "This is a sentence .".split()
    assert apply_edits(s[1].source, s[1].edits[0]) == "He went to school .".split()
    # insertion + replacement starting at the same offset, noop ignored
    src = "a b c".split()
    edits = [Edit(1, 2, ("B",)), Edit(1, 1, ("x", "y")), Edit(-1, -1, ())]
    assert apply_edits(src, edits) == "a x y B c".split()
    with pytest.raises(ValueError):
        apply_edits(src, [Edit(0, 2, ("z",)), Edit(1, 3, ())])


@pytest.mark.parametrize(
    "bad",
    [
        "A 1 2|||R|||x|||REQUIRED|||-NONE-|||0\n",  # A before S
        "S a b\nA 1|||R|||x|||REQUIRED|||-NONE-|||0\n",  # bad span
        "S a b\nA 1 5|||R|||x|||REQUIRED|||-NONE-|||0\n",  # out of range
        "S a b\nX what\n",  # unknown line
        "S a b\nA 0 1|||R\n",  # too few fields
    ],
)
def test_parse_m2_malformed(bad):
    from fairseq_aggressive.evaluation.m2 import M2FormatError

    with pytest.raises(M2FormatError):
        parse_m2(bad.splitlines())


# ------------------------------------------------------------------ scoring


def test_perfect_correction():
    r = score(TWO, ["This is a sentence .", "He went to school ."])
    assert prf(r) == (3, 3, 3, 1.0, 1.0, 1.0)


def test_no_correction_precision_is_one_by_convention():
    r = score(TWO, ["This are a sentence .", "He go to school yesterday ."])
    assert prf(r) == (0, 0, 3, 1.0, 0.0, 0.0)


def test_partial():
    # are->is (TP), a->'' (FP), go->goes (FP), yesterday->'' (TP)
    r = score(TWO, ["This is sentence .", "He goes to school ."])
    assert (r.tp, r.proposed, r.gold) == (2, 4, 3)
    assert r.precision == pytest.approx(0.5)
    assert r.recall == pytest.approx(2 / 3)
    assert r.f == pytest.approx(10 / 19)  # 1.25*(1/2)(2/3) / (0.25*(1/2) + 2/3)


def test_deletion_only():
    r = score(TWO, ["This are a sentence .", "He go to school ."])
    assert prf(r)[:3] == (1, 1, 3)
    assert r.f == pytest.approx((1.25 * 1 * (1 / 3)) / (0.25 * 1 + 1 / 3))


INS = """S I like cats
A 1 1|||M:ADV|||really|||REQUIRED|||-NONE-|||0
"""


def test_insertion_and_wrong_edit():
    assert prf(score(INS, ["I really like cats"])) == (1, 1, 1, 1.0, 1.0, 1.0)
    assert prf(score(INS, ["I very like cats"])) == (0, 1, 1, 0.0, 0.0, 0.0)
    r = score(INS, ["I really really like cats"])  # one gold insertion matched once
    assert (r.tp, r.proposed, r.gold) == (1, 2, 1)
    assert r.f == pytest.approx(1.25 * 0.5 / (0.25 * 0.5 + 1))


def test_multi_token_insertion_and_alternatives():
    m2 = "S x y\nA 0 0|||M|||a b|||REQUIRED|||-NONE-|||0\n"
    assert prf(score(m2, ["a b x y"])) == (1, 1, 1, 1.0, 1.0, 1.0)
    m2 = "S He go home .\nA 1 2|||R|||goes||went|||REQUIRED|||-NONE-|||0\n"
    assert prf(score(m2, ["He went home ."])) == (1, 1, 1, 1.0, 1.0, 1.0)
    assert prf(score(m2, ["He goes home ."])) == (1, 1, 1, 1.0, 1.0, 1.0)


MERGE = """S I am look forward to see you .
A 2 6|||R:OTHER|||looking forward to seeing|||REQUIRED|||-NONE-|||0
"""


def test_merged_edit_needs_max_unchanged_words():
    hyp = ["I am looking forward to seeing you ."]
    # look->looking and see->seeing with 2 unchanged words between: one merged edit
    assert prf(score(MERGE, hyp)) == (1, 1, 1, 1.0, 1.0, 1.0)
    assert prf(score(MERGE, hyp, max_unchanged_words=2)) == (1, 1, 1, 1.0, 1.0, 1.0)
    # with at most 1 unchanged word the two changes stay separate and both miss
    assert prf(score(MERGE, hyp, max_unchanged_words=1)) == (0, 2, 1, 0.0, 0.0, 0.0)


def test_non_gold_changes_close_together_count_as_one_edit():
    m2 = "S a b c d\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n"
    assert (score(m2, ["x b y d"]).proposed) == 1  # a..c merged (1 unchanged word)
    assert (score(m2, ["x b c y"]).proposed) == 1  # 2 unchanged words
    assert (score(m2, ["x b c y"], max_unchanged_words=1).proposed) == 2


def test_second_annotator_gives_better_score():
    m2 = """S This are good .
A 1 2|||R|||is|||REQUIRED|||-NONE-|||0
A 1 2|||R|||was|||REQUIRED|||-NONE-|||1
"""
    r = score(m2, ["This was good ."])
    assert prf(r) == (1, 1, 1, 1.0, 1.0, 1.0)
    assert r.sentences[0].annotator == 1
    r = score(m2, ["This is good ."])
    assert r.sentences[0].annotator == 0


RUNNING = """S a b c
A 1 2|||R|||x|||REQUIRED|||-NONE-|||0

S d e f g
A 0 1|||R|||D|||REQUIRED|||-NONE-|||0
A 3 4|||R|||G|||REQUIRED|||-NONE-|||0
A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||1
"""


def test_annotator_choice_uses_running_totals():
    # sentence 2: annotator 0 -> (c,e,g) = (1,1,2), annotator 1 (noop) -> (0,1,0)
    # running F: ann0 1.25*2/(0.25*3+2)=0.909 > ann1 1.25*1/(0.25*1+2)=0.556
    r = score(RUNNING, ["a x c", "D e f g"])
    assert [s.annotator for s in r.sentences] == [0, 0]
    assert (r.tp, r.proposed, r.gold) == (2, 2, 3)
    assert r.f == pytest.approx(10 / 11)
    # unchanged sentence 2: the noop annotator (gold 0) wins
    r = score(RUNNING, ["a x c", "d e f g"])
    assert [s.annotator for s in r.sentences] == [0, 1]
    assert prf(r) == (1, 1, 1, 1.0, 1.0, 1.0)


def test_annotator_tie_break_prefers_smaller_proposed_plus_beta2_gold():
    # unchanged hypothesis: F = 0 and TP = 0 for both annotators; the one with
    # fewer gold edits has the smaller PROPOSED + b^2*GOLD and is chosen,
    # whatever its id.
    m2 = """S a b c
A 0 1|||R|||A|||REQUIRED|||-NONE-|||0
A 1 2|||R|||B|||REQUIRED|||-NONE-|||0
A 2 3|||R|||C|||REQUIRED|||-NONE-|||1
"""
    r = score(m2, ["a b c"])
    assert r.sentences[0].annotator == 1 and r.gold == 1
    assert prf(r) == (0, 0, 1, 1.0, 0.0, 0.0)


def test_noop_gold_and_ignore_whitespace_casing():
    m2 = "S the cat sat\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n"
    assert prf(score(m2, ["the cat sat"])) == (0, 0, 0, 1.0, 1.0, 1.0)
    # a casing-only change is a wrong edit by default (P=0, R=1 by convention, F=0)
    assert prf(score(m2, ["The cat sat"])) == (0, 1, 0, 0.0, 1.0, 0.0)
    assert prf(score(m2, ["The cat sat"], ignore_whitespace_casing=True)) == (0, 0, 0, 1.0, 1.0, 1.0)


def test_empty_hypothesis():
    m2 = "S a b\nA 1 2|||U|||-NONE-|||REQUIRED|||-NONE-|||0\n"
    # deletion of a (wrong) + deletion of b (gold): TP 1, proposed 2, gold 1
    r = score(m2, [""])
    assert (r.tp, r.proposed, r.gold) == (1, 2, 1)
    assert r.f == pytest.approx(5 / 9)  # 1.25*0.5*1/(0.25*0.5+1)
    m2 = "S He go home .\nA 1 2|||R|||goes|||REQUIRED|||-NONE-|||0\n"
    assert prf(score(m2, [""])) == (0, 1, 1, 0.0, 0.0, 0.0)  # one merged deletion


def test_beta_one():
    r = score(TWO, ["This is sentence .", "He goes to school ."], beta=1.0)
    assert r.f == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_line_count_mismatch_raises():
    with pytest.raises(ValueError):
        score(TWO, ["only one line"])


# ------------------------------------------------------------------ CLI


def _run(*args):
    exe = BIN / "fairseq-aggressive-m2"
    assert exe.exists(), "run: pip install -e . --no-deps"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # (the command)
def test_cli_output_format(tmp_path):
    gold = tmp_path / "gold.m2"
    gold.write_text(TWO, encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("This is sentence .\nHe goes to school .\n", encoding="utf-8")
    p = _run(hyp, gold)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Precision   : 0.5000\nRecall      : 0.6667\nF_0.5       : 0.5263\n"
    p = _run(hyp, gold, "--beta", "1.0", "--max-unchanged-words", "2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[2] == "F_1.0       : 0.5714"


@pytest.mark.slow
def test_cli_errors(tmp_path):
    gold = tmp_path / "gold.m2"
    gold.write_text(TWO, encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("only one line\n", encoding="utf-8")
    bad = tmp_path / "bad.m2"
    bad.write_text("S a b\nA 0 9|||R|||x|||REQUIRED|||-NONE-|||0\n", encoding="utf-8")
    for args, needle in [
        ((hyp, gold), "1 lines but"),
        ((hyp, tmp_path / "missing.m2"), "not found"),
        ((hyp, bad), "malformed M2"),
    ]:
        p = _run(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert needle in p.stderr and "Traceback" not in p.stderr
        assert p.stdout == ""


def test_cli_in_process_verbose(tmp_path, capsys):
    gold = tmp_path / "gold.m2"
    gold.write_text(TWO, encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("This is a sentence .\nHe went to school .\n", encoding="utf-8")
    assert cli_main([str(hyp), str(gold), "-v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == ["Precision   : 1.0000", "Recall      : 1.0000", "F_0.5       : 1.0000"]
    assert any("Chosen Annotator" in line for line in out)


# ------------------------------------------------------------------ parallel <-> M2

SRC = ["He go to school yesterday .", "This is fine .", "a b c d e", "", "x y z"]
TGT = ["He went to school .", "This is fine .", "a B C d x e f", "new words", ""]


def test_parallel_to_m2_minimal_edits():
    from fairseq_aggressive.evaluation.parallel_to_m2 import align_edits, m2_block

    assert align_edits("a b c d e".split(), "a B C d x e f".split()) == [
        Edit(1, 3, ("B", "C"), "R:OTHER"),
        Edit(4, 4, ("x",), "M:OTHER"),
        Edit(5, 5, ("f",), "M:OTHER"),
    ]
    assert m2_block(["same"], ["same"]) == "S same\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n"
    assert m2_block(["a", "b"], ["a"]) == "S a b\nA 1 2|||U:OTHER||||||REQUIRED|||-NONE-|||0\n"


def test_parallel_m2_round_trip(tmp_path):
    src, tgt, m2 = tmp_path / "s.txt", tmp_path / "t.txt", tmp_path / "g.m2"
    src.write_text("\n".join(SRC) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(TGT) + "\n", encoding="utf-8")
    assert parallel_to_m2.cli_main([str(src), str(tgt), "-o", str(m2)]) == 0
    sents = read_m2(str(m2))
    assert len(sents) == len(SRC)
    assert sents[1].edits == {0: []}
    out_s, out_t = tmp_path / "o.src", tmp_path / "o.tgt"
    assert m2_to_parallel.cli_main([str(m2), "--annotator", "0", "--src", str(out_s), "--tgt", str(out_t)]) == 0
    assert [l.split() for l in out_s.read_text(encoding="utf-8").splitlines()] == [s.split() for s in SRC]
    assert [l.split() for l in out_t.read_text(encoding="utf-8").splitlines()] == [t.split() for t in TGT]
    # the gold built from parallel text scores the target perfectly and the source at R=0
    r = score_m2(TGT, sents)
    assert (r.precision, r.recall, r.f) == (1.0, 1.0, 1.0)
    r = score_m2(SRC, sents)
    assert (r.tp, r.proposed, r.precision, r.recall) == (0, 0, 1.0, 0.0)


def test_m2_to_parallel_annotator_and_missing(tmp_path):
    m2 = tmp_path / "g.m2"
    m2.write_text(RUNNING, encoding="utf-8")
    s, t = tmp_path / "o.src", tmp_path / "o.tgt"
    assert m2_to_parallel.cli_main([str(m2), "--annotator", "1", "--src", str(s), "--tgt", str(t)]) == 0
    assert t.read_text().splitlines() == ["a b c", "d e f g"]  # sentence 1 copied unchanged
    assert m2_to_parallel.cli_main([str(m2), "--annotator", "1", "--src", str(s), "--tgt", str(t), "--skip-missing"]) == 0
    assert t.read_text().splitlines() == ["d e f g"]
    assert m2_to_parallel.cli_main([str(m2), "--annotator", "0", "--src", str(s), "--tgt", str(t)]) == 0
    assert t.read_text().splitlines() == ["a x c", "D e f G"]


def test_parallel_to_m2_module_cli_mismatch(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x\ny\n")
    b.write_text("x\n")
    p = subprocess.run(
        [sys.executable, "-m", "fairseq_aggressive.evaluation.parallel_to_m2", str(a), str(b), "-o", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 2 and "2 lines" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------ ERRANT wrapper (optional)


def test_errant_wrapper_blank_pipeline(tmp_path, capfd):
    pytest.importorskip("errant")
    from fairseq_aggressive.evaluation import errant_eval

    orig, hyp, ref = tmp_path / "o", tmp_path / "h", tmp_path / "r.m2"
    orig.write_text("This are a sentence .\nHe go home .\n")
    hyp.write_text("This is a sentence .\nHe go home .\n")
    ref.write_text(
        "S This are a sentence .\nA 1 2|||R:VERB:SVA|||is|||REQUIRED|||-NONE-|||0\n\n"
        "S He go home .\nA 1 2|||R:VERB:SVA|||goes|||REQUIRED|||-NONE-|||0\n"
    )
    out_m2 = tmp_path / "h.m2"
    rc = errant_eval.cli_main(
        ["--orig", str(orig), "--hyp", str(hyp), "--ref", str(ref), "--spacy-model", "blank:en", "--out-m2", str(out_m2)]
    )
    assert rc == 0
    blocks = out_m2.read_text().strip().split("\n\n")
    assert blocks[0].splitlines()[1].startswith("A 1 2|||") and blocks[0].splitlines()[1].endswith("|||is|||REQUIRED|||-NONE-|||0")
    assert blocks[1].splitlines()[1] == "A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0"
    out = capfd.readouterr().out
    assert "1\t0\t1\t1.0\t0.5\t0.8333" in out  # TP FP FN P R F0.5


def test_errant_wrapper_missing_spacy_model(tmp_path, capsys):
    pytest.importorskip("errant")
    from fairseq_aggressive.evaluation import errant_eval

    f = tmp_path / "x"
    f.write_text("a b\n")
    ref = tmp_path / "r.m2"
    ref.write_text("S a b\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n")
    rc = errant_eval.cli_main(
        ["--orig", str(f), "--hyp", str(f), "--ref", str(ref), "--spacy-model", "no_such_spacy_model_xyz"]
    )
    assert rc == 2
    assert "python -m spacy download en_core_web_sm" in capsys.readouterr().err
