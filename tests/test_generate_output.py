"""fairseq-generate output is read in one place (evaluation/generate_output.py)."""
from fairseq_aggressive.evaluation.generate_output import hypotheses_and_references, parse_generate_lines

OUTPUT = """2026-11-24 04:00:00 | INFO | fairseq_cli.generate | loading model(s)
S-1\tb c
T-1\tb d
H-1\t-0.25\tb d
D-1\t-0.25\tb d
P-1\t-0.1 -0.4
S-0\ta
T-0\ta
H-0\t-1.5\t
S-2\tno hypothesis
Generate test with beam=1: BLEU4 = 1.0
"""


def test_parse_generate_lines_by_id():
    got = parse_generate_lines(OUTPUT.splitlines(True))
    assert got[1] == {"S": "b c", "T": "b d", "H": "b d", "H_score": "-0.25"}
    assert got[0]["H"] == "" and got[0]["H_score"] == "-1.5"  # an empty hypothesis is kept
    assert "H" not in got[2] and set(got) == {0, 1, 2}


def test_hypotheses_and_references_in_id_order(tmp_path):
    f = tmp_path / "gen.txt"
    f.write_text(OUTPUT, encoding="utf-8")
    assert hypotheses_and_references(f) == (["", "b d"], ["a", "b d"])
