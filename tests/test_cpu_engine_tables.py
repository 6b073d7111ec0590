"""scripts/experiments/cpu_engine_tables.py: the results tables' runs, in
order, resumable; a real run of one part on the bundled sample writes its
outputs, prints its table, and is skipped when run again."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from helpers import ROOT, run

SCRIPT = os.path.join(ROOT, "scripts", "experiments", "cpu_engine_tables.py")
DEMO = os.path.join(ROOT, "scripts", "demo.py")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _commands(stdout):
    return [line[2:] for line in stdout.splitlines() if line.startswith("$ ")]


def test_dry_run_lists_every_run_and_writes_nothing(tmp_path):
    work = tmp_path / "work"
    out = run([sys.executable, SCRIPT, "--work", str(work), "--dry-run"]).stdout
    cmds = _commands(out)
    # the data and the two widened models first (none exist under this work directory)
    assert "prepare_uagec.py" in cmds[0]
    assert "widen_model.py" in cmds[1] and "--dim 512" in cmds[1]
    assert "widen_model.py" in cmds[2] and "--dim 1024" in cmds[2]
    bench = [c for c in cmds if "fairseq-aggressive-bench" in c]
    # ct2: 4 models x 2 loads; exact: 4 models; workers, per model: W=1, then W=2 and 4 x 2 loads; on a
    # CPU whose AMX tiles the engine uses, amx: d=512 and d=1024 x 2 loads after the rest
    from fairseq_aggressive.native import build

    amx = "avx512amx" in build.runnable_targets()
    assert len(bench) == 8 + 4 + 4 * 5 + (4 if amx else 0), bench
    rates = [c for c in cmds if "linear_rate.py" in c]
    assert len(rates) == (4 if amx else 0) and all("--decoder-layers 3" in c for c in rates)
    if amx:
        assert all("iad-int8:avx512vnni" in c for c in bench[-4:])
        assert [c.split("--amx-min-rows ")[1].split()[0] for c in rates] == ["1", "99"] * 2
    assert all("ct2-best" in c for c in bench[:8])
    assert [c.split("--bench-load ")[1].split()[0] for c in bench[:8]] == ["0", "2"] * 4
    assert "--bench-max-sentences 60 " in bench[6] and "d1024.pt" in bench[6]
    assert "greedy,greedy-native,iad,greedy-int8" in bench[8]
    assert "--bench-worker-kind threads" in bench[12] and "--bench-workers 1 " in bench[12]
    workers = bench[12:32]
    for c, ckpt in zip(workers[::5], ("uagec-3x2/model.pt", "uagec-9x3/model.pt", "wide/d512.pt", "wide/d1024.pt")):
        assert ckpt in c and "--bench-workers 1 " in c
    assert all("ct2-best" in c and "--bench-workers " in c for i, c in enumerate(workers) if i % 5)
    passes = [c for c in cmds if "pass_cost.py" in c]
    # pass: each precision; then each precision right after 12 tokens and after 8 and 4 steps, x 2 loads
    precisions = [c.split("--precision ")[1].split()[0] for c in passes]
    assert precisions == ["float32", "int8"] + ["float32"] * 4 + ["int8"] * 4, precisions
    where = [(c.split("--load ")[1].split()[0], c.split("--prefix ")[1].split()[0], "--warm-steps 4" in c)
             for c in passes[2:6]]
    assert where == [("0", "12", False), ("0", "8", True), ("2", "12", False), ("2", "8", True)], where
    assert not work.exists()  # nothing written


def test_options_select_parts_models_and_scale(tmp_path):
    out = run([sys.executable, SCRIPT, "--work", str(tmp_path), "--dry-run", "--parts", "ct2", "--models", "9x3",
               "--loads", "2", "--sentences-scale", "0.1"]).stdout
    bench = [c for c in _commands(out) if "fairseq-aggressive-bench" in c]
    assert len(bench) == 1 and "--bench-load 2" in bench[0] and "--bench-max-sentences 60 " in bench[0]
    with pytest.raises(AssertionError, match="--sentences-scale must be > 0"):
        run([sys.executable, SCRIPT, "--dry-run", "--sentences-scale", "0"])


def test_table_of_takes_the_first_table_and_its_run_lines():
    tables = _load(SCRIPT, "cpu_engine_tables")
    text = ("INFO:x:loading\nmachine: M\n6 sentences, batch 1\n| mode | ms/sent |\n|---|---|\n| iad | 1.0 |\n\n"
            "| other | table |\n|---|---|\n")
    assert tables.table_of(text) == "machine: M\n6 sentences, batch 1\n| mode | ms/sent |\n|---|---|\n| iad | 1.0 |"
    assert tables.table_of("T=  1: 5 passes\nT=  2: 4 passes\n") == "T=  1: 5 passes\nT=  2: 4 passes"


@pytest.mark.slow
def test_a_part_runs_writes_its_outputs_and_resumes(tmp_path):
    """The exact part on the 9+3 over the bundled sample's first 6 test sentences (UA-GEC's
    test set stands in as WORK/uagec/bin): every exact mode equals fairseq's greedy."""
    demo = _load(DEMO, "demo")
    data, _, _ = demo.shipped_data(tmp_path)
    work = tmp_path / "work"
    (work / "uagec").mkdir(parents=True)
    os.symlink(data, work / "uagec" / "bin")
    argv = [sys.executable, SCRIPT, "--work", str(work), "--parts", "exact", "--models", "9x3",
            "--sentences-scale", "0.01"]
    first = run(argv).stdout
    out = work / "cpu-engine"
    assert (out / "exact-9x3.txt").exists() and not (out / "exact-9x3.txt.part").exists()
    assert "| iad |" in first and "| iad-int8 |" in first
    modes = json.loads((out / "exact-9x3.json").read_text())["modes"]
    assert modes["iad"]["identical_to_greedy"] == 6 and modes["greedy-native"]["identical_to_greedy"] == 6
    machine = (out / "machine.md").read_text()
    assert "family" in machine and "AMX tiles:" in machine and "every target" in machine
    again = run(argv).stdout
    assert f"(done: {out / 'exact-9x3'}.txt)" in again and not _commands(again)
    assert "| iad |" in run([sys.executable, SCRIPT, "--work", str(work), "--summary"]).stdout
