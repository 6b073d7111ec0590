"""scripts/diagnostics/profile_pass.py: the split of IAD time into its parts adds up, the
pass-cost table covers the widths, the operator table is printed."""
import json
import os
import re
import sys

import pytest

from helpers import ROOT, python

# trains a model on the sample (conftest.py's `trained`): minutes
pytestmark = pytest.mark.slow


def test_profile_pass(trained, tmp_path):
    """The parts of IAD add up, each width is timed, the operator table is printed, and --json
    writes what it printed as a result that scripts/results.py stores and the torch-pass table shows."""
    data, ckpt = trained
    proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "profile_pass.py"), str(data),
                   "--path", str(ckpt), "--sentences", "12", "--reps", "5", "--threads", "1",
                   "--json", str(tmp_path / "torch.json")],
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
    res = json.loads((tmp_path / "torch.json").read_text())
    assert f"{res['ms_per_sentence']:.2f} ms per sentence" in out and res["command"].startswith(
        "python scripts/diagnostics/profile_pass.py ")
    assert [(w, f"{p['median_ms']:.3f}") for w, p in res["passes"].items()] == [(w, ms) for w, ms, _ in widths]
    assert res["profiled"]["passes"] >= res["profiled"]["sentences"] and res["profiled"]["top_ops"]
    from fairseq_aggressive.bench.results import stored
    from fairseq_aggressive.bench.tables import TABLES
    # as scripts/results.py stores it (keys sorted): the parts still in the order of a pass
    lines = TABLES["torch-pass"]([json.loads(json.dumps(stored(res, "tiny"), sort_keys=True))])
    assert lines[0].startswith(f"tiny, 12 sentences, batch 1, 1 threads: IAD {res['ms_per_sentence']:.2f} ms")
    shares = [int(line.split("|")[4].strip().rstrip("%")) for line in lines[4:9]]
    assert lines[4].startswith("| encoder (") and abs(sum(shares) - 100) <= 3, lines


def test_pass_cost(trained, tmp_path):
    """scripts/diagnostics/pass_cost.py: a pass over T positions after a prefix in the
    cache (float32: after 2 more one-token steps, beside a CPU-bound process), float32
    and int8, each width timed and its ratio to a one-token step printed; with --stages
    (int8 here) the time of each stage of the passes by width; --json writes what it
    printed as a result scripts/results.py stores; a negative count is refused."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    data, ckpt = trained
    for precision in ("float32", "int8"):
        proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "pass_cost.py"), str(data),
                       "--path", str(ckpt), "--sentences", "12", "--threads", "1", "--positions", "1,2,4",
                       "--prefix", "2", "--precision", precision, "--rounds", "2",
                       "--json", str(tmp_path / f"{precision}.json")]
                      + (["--stages"] if precision == "int8" else ["--warm-steps", "2", "--load", "1"]),
                      capture_output=True, text=True, timeout=600)
        # (the script fails where a timed pass does not accept greedy's own continuation,
        # so warm steps that fed other tokens than greedy's would fail it)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
        assert f"; {precision}; prefix 2" + ("; 2 warm steps" if precision == "float32" else "") in out, out
        assert ("; 1 CPU-bound processes beside it" in out) == (precision == "float32"), out
        rows = re.findall(r"^T=\s*(\d+): (\d+) passes, median ([\d.]+) ms, mean [\d.]+ ms per pass, ([\d.]+)x T=1$",
                          out, re.M)
        assert [r[0] for r in rows] == ["1", "2", "4"], out
        assert all(int(n) > 0 and float(ms) > 0 for _, n, ms, _ in rows) and rows[0][3] == "1.00", out
        res = json.loads((tmp_path / f"{precision}.json").read_text())
        assert (res["kind"], res["precision"], res["prefix"], res["load"]) == (
            "pass_cost", precision, 2, 1 if precision == "float32" else 0), res
        assert [(T, p["n"], f"{p['median_ms']:.3f}") for T, p in res["passes"].items()] == [
            (T, int(n), ms) for T, n, ms, _ in rows], res
        assert res["command"].startswith("python scripts/diagnostics/pass_cost.py ") and res["machine"]["cores"] >= 1
        from fairseq_aggressive.bench.results import stored
        assert stored(res, "x")["passes"] == res["passes"]  # storable as it is
        stage_rows = re.findall(r"^\| ([a-z/ ]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| [-+\d.]+ \| [-+\d.]+ \|$",
                                out, re.M)
        stages = {m[0]: m[1:] for m in stage_rows}
        if precision == "float32":
            assert not stages, out
            continue
        for name in ("self q/k/v", "self attention", "cross attention", "ffn", "projection", "choose", "emit",
                     "bookkeeping", "total"):
            assert name in stages, out
        assert all(float(ms) > 0 for name in ("self attention", "ffn", "projection") for ms in stages[name]), out
        # the stages (with the bookkeeping and the call around the pass) add up to a pass's mean time
        means = re.findall(r"^T=\s*\d+: \d+ passes, median [\d.]+ ms, mean ([\d.]+) ms per pass", out, re.M)
        for i, mean in enumerate(means):
            assert abs(float(stages["total"][i]) - float(mean)) <= 0.002, out
        assert set(res["stages_ms"]) == {"1", "2", "4"} and "ffn" in res["stages_ms"]["4"], res
    proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "pass_cost.py"), str(data),
                   "--path", str(ckpt), "--warm-steps", "-1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "--warm-steps and --load must be >= 0" in proc.stderr, proc.stderr[-3000:]


def test_compare_builds(trained, tmp_path):
    """scripts/diagnostics/compare_builds.py: two engine libraries side by side in
    one process (here the test library against the engine's own), greedy and
    IAD and the encoder alone timed per sentence (alternating sentence by
    sentence, or each over every sentence in turn), outputs compared bit for
    bit, each side on engines of its own library; a file that is not an
    engine library is a clear error."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    from fairseq_aggressive.native import build

    data, ckpt = trained
    script = os.path.join(ROOT, "scripts", "diagnostics", "compare_builds.py")
    proc = python([sys.executable, script, str(data), "--path", str(ckpt), "--other", build.test_library()._name,
                   "--sentences", "8", "--threads", "1", "--rounds", "1"],
                  capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each side decodes on its own library (not on engines that share the first side's weights)
    assert f"other side's engines run: {build.test_library()._name}\n" in proc.stdout, proc.stdout
    assert f"this side's engines run: {build.library()._name}\n" in proc.stdout, proc.stdout
    found = re.findall(r"^(greedy|iad|encoder): this build ([\d.]+) ms per sentence, the other ([\d.]+): this one "
                       r"([\d.]+)x as fast; the same bits in (\d+)/(\d+) sentences$", proc.stdout, re.M)
    assert [f[0] for f in found] == ["greedy", "iad", "encoder"], proc.stdout
    for _, this, other, _, same, total in found:
        assert float(this) > 0 and float(other) > 0 and same == total == "8", proc.stdout
    proc = python([sys.executable, script, str(data), "--path", str(ckpt), "--other",
                   build.test_library()._name, "--sentences", "2", "--threads", "1", "--rounds", "2",
                   "--first", "other", "--by", "round"],
                  capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "engines made first: other's" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert f"other side's engines run: {build.test_library()._name}\n" in proc.stdout, proc.stdout
    found = re.findall(r"^(greedy|iad|encoder): .* the same bits in (\d+)/(\d+) sentences$", proc.stdout, re.M)
    assert found == [(m, "2", "2") for m in ("greedy", "iad", "encoder")], proc.stdout  # each build over every sentence
    bad = tmp_path / "not-a-library.so"
    bad.write_text("no")
    proc = python([sys.executable, script, str(data), "--path", str(ckpt), "--other", str(bad)],
                  capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot load the native engine" in proc.stderr, proc.stderr[-2000:]


def test_linear_rate():
    """scripts/diagnostics/linear_rate.py: the engine's linear kernels timed by rows
    per call beside the float32 peak, float32 and int8, each shape's row counts
    against one row's.  No kernel runs past the peak it is measured against (a
    peak probe whose accumulators outnumber the vector registers spills them and
    reads low: on AVX2 the kernels of 32 rows then showed 130-160% of it)."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.py"),
                   "--dim", "128", "--ffn", "512", "--vocab", "300", "--rows", "3,32", "--threads", "1",
                   "--precision", "float32", "int8", "--decoder-layers", "2"], capture_output=True, text=True,
                  timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for precision in ("float32", "int8"):
        block = out.split(f"{precision}, 1 thread(s)")[1].split("\n\n")[0]
        peak = re.match(r": float32 fused multiply-add peak (\d+) GFLOP/s", block)
        assert peak and int(peak.group(1)) > 0, out
        peak8 = re.search(r"int8 product peak \(the vector tiles' instructions\) (\d+) GOPS", block)
        assert (peak8 is not None and int(peak8.group(1)) > 0) == (precision == "int8"), out
        rows = re.findall(r"^\| (q\+k\+v|out|fc1|fc2|vocab) \((\d+) x (\d+)\) \| (.*) \|$", block, re.M)
        assert [(r[0], r[1], r[2]) for r in rows] == [("q+k+v", "384", "128"), ("out", "128", "128"),
                                                     ("fc1", "512", "128"), ("fc2", "128", "512"),
                                                     ("vocab", "300", "128")], out
        for r in rows:
            cells = r[3].split(" | ")
            assert len(cells) == 3 and cells[0].endswith(", 1.00x"), out  # M = 1, 3, 32
            assert all(float(c.split(" us")[0]) > 0 for c in cells), out
            # the shares of the peaks (int8: of the float32 peak, then of its own), with room for the host's noise
            shares = [float(v) for c in cells for v in re.findall(r"(\d+)%", c)[1 if precision == "int8" else 0:]]
            if precision == "float32" or "AMX tiles: none" in block:  # (AMX tiles pass the vector peak)
                assert shares and max(shares) <= 120, (r[0], shares, out)
        # --decoder-layers 2: a whole pass's products (2 x 6 layer products and the vocabulary)
        whole = re.search(r"^\| a decoder pass's products \(2 layers, ([\d.]+) MB, one after another\) \| (.*) \|$",
                          block, re.M)
        assert whole, out
        cells = whole.group(2).split(" | ")
        assert len(cells) == 3 and cells[0].endswith(", 1.00x") and all(float(c.split(" us")[0]) > 0 for c in cells)
        weights = 2 * (384 * 128 + 3 * 128 * 128 + 512 * 128 + 128 * 512) + 300 * 128
        per_value = 4 if precision == "float32" else 1  # bytes per weight (int8's scales and sums: a few %)
        assert 1.0 <= float(whole.group(1)) / (weights * per_value / 1e6) < 1.1, out
    bad = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.py"),
                  "--rows", "1,x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "row counts >= 1" in bad.stderr, bad.stderr


def test_linear_rate_compiles_for_every_target(tmp_path):
    """linear_rate.cpp compiles for every engine target of this architecture, with and without the test
    library's switches (``--amx-min-rows`` builds with them): its AMX lines compile only for the AMX
    targets, which the machine running the suite may not have (``generic-amx`` compiles anywhere).
    Syntax only; a target whose instructions this compiler lacks (an optional one) is left out."""
    import runpy
    import subprocess

    from fairseq_aggressive.native import build, targets

    try:
        cxx = build._compiler()
    except build.NativeUnavailable as e:
        pytest.skip(str(e))
    script = runpy.run_path(os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.py"))
    empty = tmp_path / "empty.cpp"
    empty.write_text("int main() { return 0; }\n")
    cmds = []
    for target in targets.all_targets().values():
        if target.optional and subprocess.run([cxx, *target.cflags, "-fsyntax-only", str(empty)],
                                              capture_output=True).returncode != 0:
            continue
        for hooks in (False, True):
            cmds.append([cxx, *script["flags"](target, hooks), "-fsyntax-only", "-I", targets.CSRC,
                         os.path.join(ROOT, "scripts", "diagnostics", "linear_rate.cpp")])
    assert any(targets.TEST_DEFINE in c for c in cmds) and len(cmds) >= 4, cmds
    build._run(cmds)  # raises with the compiler's output on the first that fails


def test_product_pieces(trained):
    """scripts/diagnostics/product_pieces.py: one engine whose shared products are cut into
    1 and 3 pieces per thread, sentence by sentence; every setting gives the same bits."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    data, ckpt = trained
    script = os.path.join(ROOT, "scripts", "diagnostics", "product_pieces.py")
    proc = python([sys.executable, script, str(data), "--path", str(ckpt), "--sentences", "6",
                   "--threads", "2", "--rounds", "1", "--pieces", "1", "3"],
                  capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.findall(r"^(greedy|iad|encoder): 1 per thread ([\d.]+) ms \(1\.000x the time of 1\), 3 per thread "
                       r"([\d.]+) ms \(([\d.]+)x the time of 1\); the same bits in (\d+)/(\d+) sentences$",
                       proc.stdout, re.M)
    assert [f[0] for f in found] == ["greedy", "iad", "encoder"], proc.stdout
    for _, one, three, _, same, total in found:
        assert float(one) > 0 and float(three) > 0 and same == total == "6", proc.stdout
    bad = python([sys.executable, script, str(data), "--path", str(ckpt), "--pieces", "0"],
                 capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--pieces" in bad.stderr, bad.stderr[-2000:]


def test_threads_side_by_side(trained):
    """scripts/diagnostics/threads_side_by_side.py: engines of 1 and 2 threads on one copy of
    the weights decode the same sentences in turn, with the same bits; --threads 1 refused."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    data, ckpt = trained
    script = os.path.join(ROOT, "scripts", "diagnostics", "threads_side_by_side.py")
    proc = python([sys.executable, script, str(data), "--path", str(ckpt), "--sentences", "6"],
                  capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"^iad: 1 thread ([\d.]+) ms per sentence, 2 threads ([\d.]+): ([\d.]+)x as fast; ([\d.]+)% of "
                  r"its calls of several items shared; the same bits in (\d+)/(\d+) sentences$", proc.stdout, re.M)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, proc.stdout
    assert m.group(5) == m.group(6) == "6", proc.stdout
    bad = python([sys.executable, script, str(data), "--path", str(ckpt), "--threads", "1"],
                 capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--threads" in bad.stderr, bad.stderr[-2000:]


def test_sentence_time(trained):
    """scripts/diagnostics/sentence_time.py: a sentence's time split into the
    engine's encoder call, its decoding loop and the Python around them (the
    parts add up to the timed pass), for IAD and greedy; with --stages the
    engine's stage timers per sentence."""
    from helpers import NATIVE_REASON

    if NATIVE_REASON is not None:
        pytest.skip(NATIVE_REASON)
    data, ckpt = trained
    for mode, extra in (("iad", []), ("greedy", ["--stages"])):
        proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "sentence_time.py"),
                       str(data), "--path", str(ckpt), "--sentences", "40", "--rounds", "2", "--mode", mode]
                      + extra, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
        assert f"; int8; {mode}; " in out, out
        rounds = re.findall(r"^round (\d): whole ([\d.]+) ms per sentence; timed pass ([\d.]+): encoder ([\d.]+), "
                            r"loop ([\d.]+), python (-?[\d.]+)$", out, re.M)
        assert [r[0] for r in rounds] == ["1", "2"], out
        for _, whole, timed, enc, loop, py in rounds:
            assert float(whole) > 0 and float(enc) > 0 and float(loop) > 0, out
            assert abs(float(enc) + float(loop) + float(py) - float(timed)) <= 0.002, out
        stage_lines = re.findall(r"^  stages, ms per sentence: (.*)$", out, re.M)
        if not extra:
            assert not stage_lines, out
            continue
        assert len(stage_lines) == 2, out
        stages = dict(re.findall(r"([a-z/ ]+) ([\d.]+)(?:, |$)", stage_lines[0]))
        assert float(stages["encoder"]) > 0 and float(stages["pass"]) > 0 and float(stages["projection"]) > 0, out


def test_gad_limits(trained, trained_drafter, tmp_path):
    """scripts/diagnostics/gad_limits.py: the verifier's certainty on its own greedy choices and
    the drafter's accuracy per slot, printed and (--json) written as a result the gad-limits table
    shows."""
    data, ckpt = trained
    drafter = trained_drafter
    proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "gad_limits.py"),
                   "--drafter", str(drafter), "--verifier", str(ckpt), "--sentences", "40",
                   "--json", str(tmp_path / "limits.json")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "limits.json").read_text())
    assert res["sentences"] == 40 and res["block_size"] == 4 and list(res["slots"]) == ["drafter"]
    m = re.search(r"median ([\d.]+), above 0\.9: ([\d.]+)%", proc.stdout)
    assert m and m.group(1) == f"{res['top1']['median']:.3f}", proc.stdout
    acc = res["slots"]["drafter"]["accuracy"]
    assert len(acc) == 4 and all(0 <= a <= 1 for a in acc)
    assert f"slot accuracy {' '.join(f'{a:.3f}' for a in acc)}" in proc.stdout
    from fairseq_aggressive.bench.results import stored
    from fairseq_aggressive.bench.tables import TABLES
    assert TABLES["gad-limits"]([stored(res, "tiny")])[4].startswith("| drafter | ")
