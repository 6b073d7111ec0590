"""scripts/diagnostics/draft_lengths_side_by_side.py on the shipped 9+3: the
engine's greedy, IAD with fixed drafts and IAD under the draft-length policy
side by side, every output checked against greedy's (the script fails where
one differs)."""
import os
import re
import sys

import pytest

from helpers import ROOT, needs_native, python

pytestmark = needs_native


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_draft_lengths_side_by_side():
    script = os.path.join(ROOT, "scripts", "diagnostics", "draft_lengths_side_by_side.py")
    proc = python([sys.executable, script, os.path.join(ROOT, "models", "uagec-9x3"),
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
        proc = python([sys.executable, script, "models/uagec-9x3", "data/uagec-sample/test.tok.src", *bad],
                      capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode != 0 and "must be >= 1" in proc.stderr, bad


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_backend_load_without_http():
    """scripts/diagnostics/backend_load.py: the serving backend in process, closed
    loop and a full running batch, every output checked against greedy's."""
    script = os.path.join(ROOT, "scripts", "diagnostics", "backend_load.py")
    proc = python([sys.executable, script, os.path.join(ROOT, "models", "uagec-9x3"),
                   os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), "--max-sentences", "24",
                   "--rounds", "1", "--requests", "24", "--clients", "3", "--modes", "iad,greedy"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "outputs different from greedy's: 0" in proc.stdout
    rows = re.findall(r"^\| (iad|greedy) \| ([\d.]+) \| ([\d.]+)x \|", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["iad", "greedy"] and float(rows[1][2]) == 1.0, proc.stdout
    proc = python([sys.executable, script, "models/uagec-9x3", "data/uagec-sample/test.tok.src",
                   "--modes", "iad"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode != 0 and "greedy among them" in proc.stderr
