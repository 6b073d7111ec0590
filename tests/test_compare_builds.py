"""Diagnostics that time two ways side by side in one process:
compare_builds_streamed.py (two engine library files, a null pair here: a copy
of the one this checkout loads, stream the same sentences in turns, every
output checked against the sentence's own translate(s); the same file on both
sides is refused), lanes_side_by_side.py (static batches or a stream whole and in
lanes, the outputs checked equal) lane_rows_side_by_side.py (streams with
and without each lane's bound on its rows, the outputs checked) and cpu_share.py
(the engine's stream and CTranslate2 quiet and beside busy processes in turns, with
the CPUs each held)."""
import os
import re
import shutil
import sys

import pytest

from helpers import ROOT, needs_native, python

pytestmark = needs_native

SCRIPT = os.path.join(ROOT, "scripts", "diagnostics", "compare_builds_streamed.py")
ARGS = ["models/uagec-9x3", "data/uagec-sample/test.tok.src"]


def _library() -> str:
    from fairseq_aggressive.native import build

    return build.library()._name


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_a_null_pair_streams_and_is_timed(tmp_path):
    copy = str(tmp_path / "engine-copy.so")
    shutil.copyfile(_library(), copy)
    proc = python([sys.executable, SCRIPT, *ARGS, "--other", copy, "--rows", "1,4", "--rounds", "2",
                   "--repeat", "1", "--sentences", "8", "--threads", "1"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^(\d+) rows: this build best ([\d.]+), median ([\d.]+) ms a sentence; the other best "
                       r"([\d.]+), median ([\d.]+); this one ([\d.]+)x as fast$", proc.stdout, re.M)
    assert [x[0] for x in lines] == ["1", "4"], proc.stdout
    assert all(float(v) > 0 for x in lines for v in x[1:]), proc.stdout
    assert "machine: " in proc.stdout and copy in proc.stdout


def test_one_file_on_both_sides_is_refused():
    proc = python([sys.executable, SCRIPT, *ARGS, "--other", _library(), "--sentences", "4"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 2 and "nothing to compare" in proc.stderr, proc.stderr[-2000:]
    proc = python([sys.executable, SCRIPT, *ARGS, "--other", _library(), "--rounds", "0"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "must be >= 1" in proc.stderr


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_lanes_side_by_side():
    script = os.path.join(ROOT, "scripts", "diagnostics", "lanes_side_by_side.py")
    proc = python([sys.executable, script, *ARGS, "--batch-size", "4", "--sentences", "12", "--rounds", "1"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"a pass reads ([\d.]+) MB of weights; default lanes: (\d+)", proc.stdout)
    assert m and 1 < float(m.group(1)) < 8 and int(m.group(2)) >= 1, proc.stdout  # the 9+3: lanes where threads
    m = re.search(r"^in (\d+) lanes ([\d.]+) ms a sentence, whole ([\d.]+): lanes ([\d.]+)x as fast$",
                  proc.stdout, re.M)
    assert m and all(float(x) > 0 for x in m.groups()), proc.stdout
    proc = python([sys.executable, script, *ARGS, "--stream", "6", "--sentences", "12", "--rounds", "1"],
                  capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"streamed through 6 rows, .* \(a stream's: \d+\)", proc.stdout), proc.stdout
    m = re.search(r"^in (\d+) lanes ([\d.]+) ms a sentence, whole ([\d.]+): lanes ([\d.]+)x as fast$",
                  proc.stdout, re.M)
    assert m and all(float(x) > 0 for x in m.groups()), proc.stdout
    for bad in (["--batch-size", "1"], ["--stream", "1"]):
        proc = python([sys.executable, script, *ARGS, *bad], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode != 0 and "must be >= 2" in proc.stderr


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_lane_rows_side_by_side():
    script = os.path.join(ROOT, "scripts", "diagnostics", "lane_rows_side_by_side.py")
    proc = python([sys.executable, script, *ARGS, "--rows", "4,40", "--sentences", "40", "--rounds", "1",
                   "--repeat", "1", "--bound", "3"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"rows a lane at most: 3;", proc.stdout), proc.stdout
    got = re.findall(r"^(\d+) rows: bound ([\d.]+) ms a sentence, unbound ([\d.]+): the bound ([\d.]+)x as fast$",
                     proc.stdout, re.M)
    assert [g[0] for g in got] == ["4", "40"] and all(float(x) > 0 for g in got for x in g[1:]), proc.stdout
    for bad in (["--rows", "0"], ["--bound", "0"]):
        proc = python([sys.executable, script, *ARGS, *bad], capture_output=True, text=True, timeout=300,
                      cwd=ROOT)
        assert proc.returncode != 0 and "must be >= 1" in proc.stderr, bad


@pytest.mark.slow
def test_cpu_share():
    pytest.importorskip("ctranslate2")
    script = os.path.join(ROOT, "scripts", "diagnostics", "cpu_share.py")
    proc = python([sys.executable, script, *ARGS, "--rows", "4", "--sentences", "12", "--rounds", "1",
                   "--load", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\| (engine stream|CTranslate2) \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      proc.stdout, re.M)
    assert sorted((w, load) for w, load, *_ in rows) == [("CTranslate2", "0"), ("CTranslate2", "1"),
                                                         ("engine stream", "0"), ("engine stream", "1")], proc.stdout
    cpus = len(os.sched_getaffinity(0))
    assert all(float(wall) > 0 and float(cpu) > 0 and 0 < float(held) <= cpus + 0.25 for *_, wall, cpu, held in rows)
    proc = python([sys.executable, script, *ARGS, "--rows", "0"], capture_output=True, text=True,
                  timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "must be >= 1" in proc.stderr
