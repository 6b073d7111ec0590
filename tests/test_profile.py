"""scripts/diagnostics/profile_pass.py: the split of IAD time into its parts adds up, the
pass-cost table covers the widths, the operator table is printed."""
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

# trains a model on the sample (conftest.py's `trained`): minutes
pytestmark = pytest.mark.slow


def test_profile_pass(trained):
    data, ckpt = trained
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "profile_pass.py"), str(data),
                           "--path", str(ckpt), "--sentences", "12", "--reps", "5", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "machine: " in out
    m = re.search(r"1\. IAD: ([\d.]+) ms per sentence, ([\d.]+) passes per sentence", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) >= 1, out
    parts = dict(re.findall(r"^\| ([a-z][^|]+?) \| [\d.]+ \| [\d.]+ \| (-?\d+)% \|$", out, re.M))
    assert {"encoder", "verifier forward", "scoring + acceptance", "drafter"} <= set(parts), parts
    assert abs(sum(int(v) for v in parts.values()) - 100) <= 3, parts  # the parts add up
    widths = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)
    assert [w for w, _, _ in widths][:3] == ["1", "2", "4"] and all(float(ms) > 0 for _, ms, _ in widths)
    assert "aten::" in out  # the operator table


def test_pass_cost(trained):
    """scripts/diagnostics/pass_cost.py: a pass over T positions after a prefix in the
    cache, float32 and int8, each width timed and its ratio to a one-token step printed."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    data, ckpt = trained
    for precision in ("float32", "int8"):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "pass_cost.py"), str(data),
                               "--path", str(ckpt), "--sentences", "12", "--threads", "1", "--positions", "1,2,4",
                               "--prefix", "2", "--precision", precision, "--rounds", "2"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
        assert f"; {precision}; prefix 2" in out, out
        rows = re.findall(r"^T=\s*(\d+): (\d+) passes, median ([\d.]+) ms, mean [\d.]+ ms per pass, ([\d.]+)x T=1$",
                          out, re.M)
        assert [r[0] for r in rows] == ["1", "2", "4"], out
        assert all(int(n) > 0 and float(ms) > 0 for _, n, ms, _ in rows) and rows[0][3] == "1.00", out


def test_linear_rate():
    """scripts/diagnostics/linear_rate.py: the engine's linear kernels timed by rows
    per call beside the float32 peak, float32 and int8, each shape's row counts
    against one row's."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.py"),
                           "--dim", "64", "--ffn", "96", "--vocab", "300", "--rows", "3,7", "--threads", "1",
                           "--precision", "float32", "int8"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for precision in ("float32", "int8"):
        block = out.split(f"{precision}, 1 thread(s)")[1].split("\n\n")[0]
        peak = re.match(r": float32 fused multiply-add peak (\d+) GFLOP/s", block)
        assert peak and int(peak.group(1)) > 0, out
        rows = re.findall(r"^\| (q\+k\+v|out|fc1|fc2|vocab) \((\d+) x (\d+)\) \| (.*) \|$", block, re.M)
        assert [(r[0], r[1], r[2]) for r in rows] == [("q+k+v", "192", "64"), ("out", "64", "64"),
                                                     ("fc1", "96", "64"), ("fc2", "64", "96"),
                                                     ("vocab", "300", "64")], out
        for r in rows:
            cells = r[3].split(" | ")
            assert len(cells) == 3 and cells[0].endswith(", 1.00x"), out  # M = 1, 3, 7
            assert all(float(c.split(" us")[0]) > 0 for c in cells), out
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.py"),
                          "--rows", "1,x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "row counts >= 1" in bad.stderr, bad.stderr
