"""scripts/diagnostics/draft_lengths_side_by_side.py on the shipped 9+3: the
engine's greedy, IAD with fixed drafts and IAD under the draft-length policy
side by side, every output checked against greedy's (the script fails where
one differs)."""
import os
import re
import subprocess
import sys

from helpers import ROOT, needs_native

pytestmark = needs_native


def test_draft_lengths_side_by_side():
    script = os.path.join(ROOT, "scripts", "diagnostics", "draft_lengths_side_by_side.py")
    proc = subprocess.run([sys.executable, script, os.path.join(ROOT, "models", "uagec-9x3"),
                           os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), "--batch-sizes", "1,5",
                           "--rounds", "1", "--max-sentences", "20", "--threads", "1"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      proc.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "5"], proc.stdout
    assert all(float(x) > 0 for r in rows for x in r[1:]), proc.stdout
    assert float(rows[0][6]) > 1.2  # batch 1 on the GEC model: the policy drafts and copies are accepted
    assert "machine: " in proc.stdout


def test_draft_lengths_side_by_side_refuses_bad_counts():
    script = os.path.join(ROOT, "scripts", "diagnostics", "draft_lengths_side_by_side.py")
    for bad in (["--rounds", "0"], ["--batch-sizes", "0,4"]):
        proc = subprocess.run([sys.executable, script, "models/uagec-9x3", "data/uagec-sample/test.tok.src", *bad],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode != 0 and "must be >= 1" in proc.stderr, bad
