"""The papers' analyses from any run: scripts/diagnostics/speedup_histogram.py
(GAD's Figure 8, the per-sentence speedup of one mode over another, from a
benchmark JSON) and scripts/diagnostics/peak_memory.py (GAD's Table 16)."""
import importlib.util
import json
import os

import pytest

from helpers import ROOT, python

_spec = importlib.util.spec_from_file_location(
    "speedup_histogram", os.path.join(ROOT, "scripts", "diagnostics", "speedup_histogram.py"))
speedup_histogram = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(speedup_histogram)


def test_histogram_table_and_plot(tmp_path, capsys):
    recs = [{"id": i, "greedy": {"ms": 4.0}, "iad": {"ms": ms}} for i, ms in enumerate([4.0, 2.0, 1.6, 1.0, 8.0])]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"per_sentence": recs, "batch_size": 1, "modes": {"greedy": {}, "iad": {}}}))
    png = tmp_path / "h.png"
    assert speedup_histogram.main([str(path), "--mode", "iad", "--bins", "1", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    # speedups 1.0, 2.0, 2.5, 4.0, 0.5
    assert "median 2.00x" in out and "1 slower" in out
    assert "| 0.00-1.00x | 1 |" in out and "| 2.00-3.00x | 2 |" in out and "| 4.00-5.00x | 1 |" in out
    assert png.stat().st_size > 1000
    with pytest.raises(SystemExit, match="has no gad"):
        speedup_histogram.main([str(path), "--mode", "gad"])


@pytest.mark.slow
def test_peak_memory_side_by_side():
    """scripts/diagnostics/peak_memory.py (GAD Table 16 on a CPU): each mode in its own
    process, peak and loaded resident memory in a table; an unknown mode refused."""
    import sys

    script = os.path.join(ROOT, "scripts", "diagnostics", "peak_memory.py")
    proc = python([sys.executable, script, "models/uagec-9x3", "data/uagec-sample/test.tok.src",
                   "--sentences", "3", "--modes", "greedy-native,beam2-native"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {ln.split("|")[1].strip(): [float(x) for x in ln.split("|")[2:6]]
            for ln in proc.stdout.splitlines() if ln.startswith("| greedy-native") or ln.startswith("| beam2-native")}
    assert set(rows) == {"greedy-native", "beam2-native"}
    for peak, loaded, adds, ratio in rows.values():
        assert peak >= loaded > 50 and ratio > 0
    assert rows["greedy-native"][3] == 1.0
    bad = python([sys.executable, script, "models/uagec-9x3", "data/uagec-sample/test.tok.src",
                  "--modes", "nope"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode != 0 and "unknown benchmark mode 'nope'" in bad.stderr
