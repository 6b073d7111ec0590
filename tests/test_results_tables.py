"""Results as data (fairseq_aggressive/bench/results.py, scripts/results.py):
the docs' generated tables equal what the stored results under results/ make,
a stored result changes its table, and a result without its command or
commit is not stored."""
import json
import os
import shutil

import pytest

from fairseq_aggressive.bench.tables import TABLES
from fairseq_aggressive.bench.results import ResultsError, load, pages, render, stored

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_generated_table_equals_what_its_results_make():
    found = pages(ROOT)
    assert any(p.endswith(os.path.join("docs", "serving.md")) for p in found)
    for page in found:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        assert render(text, ROOT) == text, f"{page}: run python scripts/results.py tables"


def test_the_script_checks_and_remakes(tmp_path):
    """`tables --check` fails on a page whose table was edited by hand; `tables` puts it back."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_script", os.path.join(ROOT, "scripts", "results.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "serving.md"
    shutil.copy(os.path.join(ROOT, "docs", "serving.md"), page)
    script.ROOT = str(tmp_path)
    assert script.main(["tables", "--check"]) == 0
    good = page.read_text()
    page.write_text(good.replace("| 9+3 | 1 | 2.00 |", "| 9+3 | 1 | 1.00 |"))
    assert script.main(["tables", "--check"]) == 1
    assert script.main(["tables"]) == 0
    assert page.read_text() == good


def test_a_stored_value_changes_its_table(tmp_path):
    shutil.copytree(os.path.join(ROOT, "results", "serving"), tmp_path / "results" / "serving")
    page = "x\n<!-- results: drafted-vs-greedy serving/offline-9x3-b1-load0.json -->\n<!-- /results -->\ny\n"
    before = render(page, str(tmp_path))
    path = tmp_path / "results" / "serving" / "offline-9x3-b1-load0.json"
    r = json.loads(path.read_text())
    r["modes"]["iad"]["mean_ms_per_sentence"] /= 2
    path.write_text(json.dumps(r))
    after = render(page, str(tmp_path))
    assert before != after and after.startswith("x\n") and after.endswith("<!-- /results -->\ny\n")
    row = [line for line in after.splitlines() if line.startswith("| 9+3 | 1 |")][0]
    g, i = (float(row.split(" | ")[k].split()[0]) for k in (2, 3))
    assert row.split(" | ")[3].endswith(f"({g / i:.2f})")


def test_stored_results_need_their_command_and_commit():
    res = {"machine": {"cpu_model": "x"}, "modes": {"iad": {}}, "per_sentence": {"0": {}}}
    with pytest.raises(ResultsError, match="command, commit"):
        stored(res, "9+3")
    out = stored(dict(res, command="fairseq-aggressive-bench ...", commit="abc"), "9+3")
    assert "per_sentence" not in out and out["label"] == "9+3"


def test_unknown_tables_and_empty_globs_are_named(tmp_path):
    (tmp_path / "results").mkdir()
    with pytest.raises(ResultsError, match="unknown results table 'nope'"):
        render("<!-- results: nope x/*.json -->\n<!-- /results -->", str(tmp_path))
    with pytest.raises(ResultsError, match="no stored results match x/"):
        load(str(tmp_path), "x/*.json")
    assert set(TABLES) >= {"drafted-vs-greedy", "beam-vs-ct2"}


def test_a_run_table_keeps_the_commands_order_and_drops_empty_columns():
    """`bench` prints each stored run's own table: its modes in the order of the command's
    --bench-modes, without a column no mode fills; the first column follows a changed order."""
    [r] = load(ROOT, "uagec/b1-t1.json")
    lines = TABLES["bench"]([r])
    assert lines[0].startswith("9+3: 300 sentences, batch 1")
    header = lines[2].strip("|").split("|")
    assert "x beam5" not in [h.strip() for h in header] and "x greedy" in [h.strip() for h in header]
    rows = [line.split("|")[1].strip() for line in lines[4:]]
    assert rows == ["greedy", "iad-torch", "iad", "greedy-native", "ct2 (float32, 1 thread)"]
    r["command"] = r["command"].replace("--bench-modes greedy,iad-torch,iad,greedy-native,ct2",
                                        "--bench-modes ct2,iad,greedy,greedy-native,iad-torch")
    rows = [line.split("|")[1].strip() for line in TABLES["bench"]([r])[4:]]
    assert rows == ["ct2 (float32, 1 thread)", "iad", "greedy", "greedy-native", "iad-torch"]


def test_targets_join_a_quiet_and_a_loaded_run_by_mode():
    """`targets`: one row per mode of the quiet run in the command's order, its target from the
    mode's suffix (else the machine's), the loaded run's time beside it ("-" where it lacks the
    mode), CTranslate2's fastest configuration named in its cell."""

    def run(load, modes):
        rows = {m: {"mean_ms_per_sentence": ms, "speedup_vs_ct2": 3.0 / ms, "mean_tokens_per_pass": 1.0,
                    "identical_to_greedy": 10} for m, ms in modes.items()}
        if "ct2-best" in rows:
            rows["ct2-best"]["ct2_config"] = {"compute_type": "int8", "threads": 1 + load // 2}
        return {"label": "9+3", "load": load, "sentences": 10, "machine": {"native_engine": "avx512vnni"},
                "command": "fairseq-aggressive-bench x --bench-modes greedy,iad:avx2,iad,ct2-best", "modes": rows}

    quiet = run(0, {"ct2-best": 3.0, "iad": 1.5, "greedy": 30.0, "iad:avx2": 2.0})
    loaded = run(2, {"iad": 2.0, "iad:avx2": 3.0, "ct2-best": 6.0})
    lines = TABLES["targets"]([loaded, quiet])
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [c[:2] for c in cells] == [["greedy (fairseq)", "-"], ["iad", "avx2"], ["iad", "avx512vnni"],
                                      ["ct2-best", "-"]]
    assert cells[0][4] == "-" and cells[1][2:6] == ["2.00", "1.50", "3.00", "1.00"] and cells[0][2] == "30.0"
    assert cells[3][2] == "3.00 (int8, 1 thread)" and cells[3][4] == "6.00 (int8, 2 threads)"


def test_a_block_reads_several_globs_joined_by_commas():
    found = load(ROOT, "uagec/b1-t1.json,uagec/b1-t2.json,uagec/b1-t*.json")
    assert [r["_path"] for r in found] == ["uagec/b1-t1.json", "uagec/b1-t2.json"]
    with pytest.raises(ResultsError, match="no stored results match"):
        load(ROOT, "uagec/none-*.json,beam/none.json")


def test_edit_spans_prints_the_bound_and_each_modes_passes_by_span():
    [r] = load(ROOT, "uagec/b1-t2.json")
    lines = TABLES["edit-spans"]([r])
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ")}
    assert lines[0] == "9+3, batch 1:" and "bound (copying)" in rows and "iad" in rows
    b = r["passes_by_edit_spans"]["iad"]["buckets"]["1"]
    assert rows["iad"].split("|")[3].strip() == f"{b['mean_passes']:.2f}"
    r["mean_edit_ratio"] = 0.9  # outputs that do not copy their sources: no table
    assert TABLES["edit-spans"]([r]) == ["9+3, batch 1:", ""]


def test_the_server_table_gives_one_at_a_time_p50_and_p99():
    from fairseq_aggressive.bench.results import load
    from fairseq_aggressive.bench.tables import TABLES

    run = load(ROOT, "serving/server-0-quiet.json")[0]
    lat = run["systems"]["iad"]["latency"]
    row = next(line for line in TABLES["serving"]([run]) if line.startswith("| iad |"))
    assert row.split(" | ")[1] == f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.1f}", row


def test_streams_at_a_glance_takes_each_precisions_faster_mode_against_ct2():
    run = load(ROOT, "streaming/bench-9x3-b32-quiet.json")[0]
    ms = {m: run["modes"][m]["mean_ms_per_sentence"] for m in run["modes"]}
    cells = [c.strip() for c in TABLES["streams-at-a-glance"]([run])[2].split("|")[1:-1]]
    assert cells[:2] == ["9+3", "32"]
    assert cells[2] == f"{ms['greedy-native-stream']:.2f} / {ms['iad-stream']:.2f}"
    best = min(ms["greedy-native-stream"], ms["iad-stream"])
    assert cells[3] == f"{ms['ct2-best'] / best:.2f}"
    best8 = min(ms["greedy-native-int8-stream"], ms["iad-int8-stream"])
    assert cells[5] == f"{ms['ct2-best'] / best8:.2f}"
    del run["modes"]["iad-stream"]  # a run without a mode: its cell says so, the other mode stands
    cells = [c.strip() for c in TABLES["streams-at-a-glance"]([run])[2].split("|")[1:-1]]
    assert cells[2] == f"{ms['greedy-native-stream']:.2f} / -"
    assert cells[3] == f"{ms['ct2-best'] / ms['greedy-native-stream']:.2f}"
