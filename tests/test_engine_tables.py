"""The CPU engine's results tables (fairseq_aggressive/bench/tables/engine.py) on made-up
stored runs, each checked cell by cell, and cpu_engine_tables.py --store writing what they read."""
import json
import os
import runpy

from fairseq_aggressive.bench.results import stored
from fairseq_aggressive.bench.tables import TABLES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _run(label, load, ms, tokens=2.0, passes=10.0, ct2_type="int8"):
    """A stored `ct2` part run: ``ms`` per mode; ct2-best's time is ``ms["ct2-best"]``."""
    modes = {}
    for m, t in ms.items():
        modes[m] = {"mean_ms_per_sentence": t, "speedup_vs_ct2": ms["ct2-best"] / t,
                    "mean_passes_per_sentence": passes * (1 if "iad" not in m else 1 / tokens),
                    "mean_tokens_per_pass": 1.0 if "iad" not in m else tokens,
                    "acceptance_by_position": [0.9, 0.8, 0.7, 0.6, 0.5], "identical_to_greedy": 9}
    modes["ct2-best"]["ct2_config"] = {"compute_type": ct2_type, "threads": 1}
    return {"label": label, "load": load, "sentences": 10, "batch_size": 1, "modes": modes,
            "command": "fairseq-aggressive-bench x --bench-modes greedy-native,iad,ct2-best"}


def _models():
    def ms(scale):
        base = {"greedy-native": 4.0, "iad": 2.0, "greedy-native-int8": 2.0, "iad-int8": 1.0, "ct2-best": 4.0,
                "greedy-native-pyloop": 5.0, "iad-pyloop": 2.5, "iad-int8-pyloop": 1.25}
        return {m: t * scale for m, t in base.items()}

    # the wide model listed first: the table orders models by what the engine's greedy costs
    return [_run("wide", 0, ms(10.0)), _run("small", 2, ms(2.0)), _run("small", 0, ms(1.0)),
            _run("wide", 2, ms(20.0), ct2_type="int8_float32")]


def test_vs_ct2_orders_models_by_cost_and_joins_quiet_and_loaded():
    lines = TABLES["vs-ct2"](_models())
    rows = [_cells(line) for line in lines[2:]]
    assert [r[0] for r in rows] == ["small", "wide"]
    assert rows[0][1] == "4.00 / 8.00 (1.00x / 1.00x)" and rows[0][2] == "2.00 / 4.00 (2.00x / 2.00x)"
    assert rows[1][4] == "10.0 / 20.0 (4.00x / 4.00x)"
    assert rows[1][5] == "40.0 (int8, 1 thread); 80.0 (int8_float32, 1 thread)"


def test_loop_in_engine_gives_the_change_and_the_tokens_per_pass():
    runs = _models()
    runs[2]["modes"]["iad-pyloop"]["mean_tokens_per_pass"] = 3.0
    rows = [_cells(line) for line in TABLES["loop-in-engine"](runs)[2:]]
    assert rows[0][1] == "5.00 -> 4.00 (-20%) / 10.0 -> 8.00 (-20%)"
    assert rows[0][4] == "3.00 -> 2.00; 2.00 -> 2.00"


def test_pass_vs_step_divides_each_sentence_by_its_passes():
    runs = _models()
    runs[2]["modes"]["iad"]["mean_passes_per_sentence"] = 4.0
    rows = [_cells(line) for line in TABLES["pass-vs-step"](runs)[2:]]
    # small, quiet: greedy 4 ms over 10 passes, IAD 2 ms over 4 passes
    assert rows[0][1] == "0.500 / 0.400 ms = 1.25" and rows[0][3] == "2.00"
    assert rows[0][4] == "0.90 0.80 0.70 0.60"


def test_exactness_counts_ties_and_other_differences():
    r = _run("m", 0, {"greedy": 9.0, "greedy-native": 1.0, "iad": 1.0, "greedy-int8": 9.0,
                      "greedy-native-int8": 1.0, "iad-int8": 1.0, "ct2-best": 2.0})
    r["modes"]["greedy-native"]["identical_to_greedy"] = 10
    r["modes"]["iad"]["identical_to_greedy"] = 10
    r["modes"]["iad-int8"]["near_ties_with_greedy"] = 1
    r["modes"]["greedy-native-int8"]["near_ties_with_greedy"] = 1
    row = _cells(TABLES["exactness"]([r])[2])
    assert row[:7] == ["m", "10", "10/10", "10/10", "reference", "9/10 (+1 ties)", "9/10 (+1 ties)"]
    assert row[7] == "0"
    r["modes"]["iad"]["identical_to_greedy"] = 8
    assert _cells(TABLES["exactness"]([r])[2])[7] == "2"


def _workers(w, load, iad, ct2):
    modes = {"iad": {"sentences_per_s": iad, "peak_rss_mb": 400.0, "latency_ms_p50": 1.0, "latency_ms_p95": 2.0}}
    if ct2:
        modes["ct2-best"] = {"sentences_per_s": ct2, "peak_rss_mb": 300.0, "ct2_config": {"compute_type": "int8"},
                             "latency_ms_p50": 1.0, "latency_ms_p95": 2.0}
    return {"label": "9+3", "workers": w, "load": load, "worker_kind": "threads", "modes": modes,
            "ct2_fastest": "ct2-best" if ct2 else None, "sentences": 10,
            "command": "fairseq-aggressive-bench x --bench-modes iad,ct2-best"}


def test_workers_puts_each_w_and_load_in_its_column():
    lines = TABLES["workers"]([_workers(2, 2, 150.0, 100.0), _workers(1, 0, 100.0, None),
                               _workers(2, 0, 300.0, 100.0)])
    assert _cells(lines[0])[1:] == ["1 decoder", "W=2 quiet", "W=2 loaded"]
    iad, ct2 = _cells(lines[2]), _cells(lines[3])
    assert iad == ["9+3, iad", "100.0 (400)", "300.0 (400); 3.00x", "150.0 (400); 1.50x"]
    assert ct2 == ["9+3, ct2-best, inter_threads=W", "-", "100.0 (int8)", "100.0 (int8)"]


def test_side_by_side_names_each_run_and_its_ratio():
    quiet = _run("9+3", 0, {"greedy-native": 2.0, "iad": 1.0, "ct2-best": 3.0})
    quiet["threads"] = {"engine": [1], "torch": 1}
    loaded = _run("9+3", 2, {"greedy-native": 4.0, "iad": 3.0, "ct2-best": 6.0})
    lines = TABLES["side-by-side"]([quiet, loaded])
    assert _cells(lines[0]) == ["mode", "quiet, 1 thread", "loaded"]
    assert _cells(lines[3]) == ["iad", "1.00", "3.00"]
    assert _cells(lines[4]) == ["ct2-best", "3.00 (int8, 1 thread)", "6.00 (int8, 1 thread)"]
    assert _cells(lines[-1]) == ["iad against ct2-best, same run", "3.00x", "2.00x"]
    two = _workers(2, 0, 300.0, 100.0)
    assert _cells(TABLES["side-by-side"]([two])[-1])[1] == "3.00x"


def _pass(precision, load, ms, stages=None):
    r = {"label": "d=512", "precision": precision, "prefix": 8, "warm_steps": 4 if load else 0, "load": load,
         "passes": {str(T): {"n": 5, "median_ms": m, "mean_ms": m} for T, m in ms.items()}}
    if stages:
        r["stages_ms"] = stages
    return r


def test_pass_cost_gives_each_width_against_a_step():
    lines = TABLES["pass-cost"]([_pass("int8", 0, {1: 0.5, 2: 0.6, 8: 1.0}), _pass("float32", 2, {1: 2.0, 4: 2.4})])
    assert _cells(lines[0]) == ["model, precision, where", "T=1 (a step)", "T=2", "T=4", "T=8"]
    assert _cells(lines[2]) == ["d=512, int8, after 8 tokens", "0.500 ms", "1.20x", "-", "2.00x"]
    assert _cells(lines[3])[0] == "d=512, float32, after 8 tokens and 4 steps, beside 2 busy processes"
    assert _cells(lines[3])[1:] == ["2.000 ms", "-", "1.20x", "-"]


def test_pass_rows_fits_a_line_and_bounds_k_steps_in_one_pass():
    """5 rows 0.2 ms, 10 rows 0.3, 20 rows 0.5: 0.1 ms fixed + 0.02 per row; four steps of 5 rows
    in one pass of 20 take 0.5 ms where four passes take 0.8: at most 1.60x. The T=1 step is left out."""
    lines = TABLES["pass-rows"]([_pass("float32", 0, {1: 0.1, 5: 0.2, 10: 0.3, 20: 0.5})])
    assert _cells(lines[0]) == ["model, precision, where", "5 rows", "10 rows", "20 rows", "fixed + per row",
                                "at most"]
    assert _cells(lines[2]) == ["d=512, float32, after 8 tokens", "0.200 ms", "0.300 ms", "0.500 ms",
                                "0.100 + 0.020 ms", "1.60x (4 steps of 5 in one pass)"]


def test_pass_stages_adds_up_what_each_width_adds():
    stages = {"1": {"ffn": 0.2, "projection": 0.1}, "4": {"ffn": 0.5, "projection": 0.15}}
    lines = TABLES["pass-stages"]([_pass("int8", 0, {1: 0.3, 4: 0.65}, stages)])
    assert lines[0] == "d=512, int8, after 8 tokens:"
    assert _cells(lines[4]) == ["ffn", "0.200", "+0.300"] and _cells(lines[6]) == ["total", "0.300", "+0.350"]


def test_store_writes_labelled_results_with_the_command_from_the_root(tmp_path):
    """cpu_engine_tables.py --store: the finished runs (text and JSON there) stored with their
    model's label and the command as typed from the repository's root; unfinished runs are not."""
    out, dest = tmp_path / "out", tmp_path / "results" / "cpu-engine"
    out.mkdir()
    res = dict(_run("?", 0, {"iad": 1.0, "ct2-best": 2.0}), machine={"cores": 2}, commit="abc")
    res["command"] = (f"fairseq-aggressive-bench {tmp_path}/w/uagec/bin --path {ROOT}/models/x.pt "
                      f"--bench-json {out}/ct2-d512-load0.json")
    for name in ("ct2-d512-load0", "ct2-9x3-load0"):
        (out / f"{name}.json").write_text(json.dumps(res))
    (out / "ct2-d512-load0.txt").write_text("done")  # ct2-9x3-load0 has not finished
    script = runpy.run_path(os.path.join(ROOT, "scripts", "experiments", "cpu_engine_tables.py"))
    assert script["store"](out, dest, ["ct2-d512-load0", "ct2-9x3-load0"], True, tmp_path / "w") == 1
    assert [p.name for p in dest.iterdir()] == ["ct2-d512-load0.json"]
    got = json.loads((dest / "ct2-d512-load0.json").read_text())
    assert got["label"] == "d=512" and got == stored(got, "d=512")
    assert got["command"] == ("FAIRSEQ_AGGRESSIVE_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2 "
                              "fairseq-aggressive-bench work/uagec/bin --path models/x.pt "
                              "--bench-json OUT/ct2-d512-load0.json")


def test_drafters_joins_quiet_and_loaded_with_both_speedups():
    def run(load, ms, sentences):
        modes = {m: {"mean_ms_per_sentence": t, "speedup_vs_greedy-native": ms["greedy-native"] / t,
                     "speedup_vs_ct2": ms["ct2-best"] / t, "mean_tokens_per_pass": 1.0, "identical_to_greedy": 9,
                     "draft_time_share": 0.25 if "feature" in m else 0.0} for m, t in ms.items()}
        modes["ct2-best"]["ct2_config"] = {"compute_type": "int8", "threads": 1}
        return {"label": "x", "load": load, "sentences": sentences, "modes": modes,
                "command": "fairseq-aggressive-bench d --bench-modes feature-ar@8,greedy-native,ct2-best"}

    lines = TABLES["drafters"]([run(2, {"greedy-native": 8.0, "feature-ar@8": 2.0, "ct2-best": 4.0}, 5),
                                run(0, {"greedy-native": 4.0, "feature-ar@8": 2.0, "ct2-best": 3.0}, 10)])
    assert _cells(lines[0])[:5] == ["mode", "quiet (10)", "x greedy-native", "x ct2-best", "loaded (5)"]
    assert _cells(lines[2]) == ["feature-ar@8", "2.00", "2.00", "1.50", "2.00", "4.00", "2.00", "1.00", "25%",
                                "9/10"]
    assert [_cells(line)[0] for line in lines[2:]] == ["feature-ar@8", "greedy-native", "ct2-best (int8, 1 thread)"]


def test_gad_limits_gives_each_drafters_slots_and_the_verifiers_certainty():
    """gad_limits.py's figures: the verifier's certainty in a sentence, a row per drafter variant
    with its accuracy in slot order; stored as gad_limits.py writes them (no modes)."""
    from fairseq_aggressive.bench.results import stored

    res = {"kind": "gad_limits", "subset": "train", "sentences": 600, "tokens": 9000, "block_size": 8,
           "top1": {"mean": 0.5, "median": 0.36, "above_0.9": 0.2},
           "slots": {"features": {"accuracy": [0.41, 0.2, 0.18], "leading": 0.62},
                     "features zeroed": {"accuracy": [0.4, 0.19, 0.1], "leading": 0.6}},
           "command": "python scripts/diagnostics/gad_limits.py", "commit": "abc", "machine": {"cores": 2}}
    lines = TABLES["gad-limits"]([stored(res, "teacher 6+6")])
    assert lines[0] == ("teacher 6+6, 600 sentences of train (9000 target tokens), block size 8: the verifier's "
                        "top-1 probability on its own greedy choices, mean 0.50, median 0.36, above 0.9 for 20% of "
                        "them.")
    assert _cells(lines[2]) == ["drafter", "slot 1", "slot 2", "slot 3", "leading slots correct"]
    assert _cells(lines[4]) == ["features", "0.41", "0.20", "0.18", "0.62"]
    assert _cells(lines[5]) == ["features zeroed", "0.40", "0.19", "0.10", "0.60"]


def test_hub_latency_splits_each_mode_and_divides_ct2_best_by_it():
    """A row per run (model, load), the modes in one order whatever the run's, each as ms (decoding /
    the rest), and ct2-best's time over each aggressive mode's; modes a run left out are dashes."""
    from fairseq_aggressive.bench.results import stored

    def run(load, modes):
        return stored({"kind": "hub_latency", "sentences": 200, "load": load, "first": next(iter(modes)),
                       "modes": modes,
                       "command": "python scripts/diagnostics/hub_latency.py", "commit": "abc",
                       "machine": {"cores": 2}}, "9+3")

    quiet = run(0, {"greedy": {"mean_ms_per_sentence": 80.0, "decoding_ms": 76.0, "identical_to_greedy": 200},
                    "iad": {"mean_ms_per_sentence": 8.0, "decoding_ms": 4.0, "identical_to_greedy": 200},
                    "translator:iad": {"mean_ms_per_sentence": 4.0, "decoding_ms": 3.5, "identical_to_greedy": 200},
                    "ct2-best": {"mean_ms_per_sentence": 6.0, "identical_to_greedy": 180,
                                 "ct2_config": {"compute_type": "int8", "threads": 1}}})
    loaded = run(2, {"iad": {"mean_ms_per_sentence": 12.0, "decoding_ms": 6.0, "identical_to_iad": 200},
                     "ct2-best": {"mean_ms_per_sentence": 9.0, "identical_to_iad": 170,
                                  "ct2_config": {"compute_type": "int8", "threads": 1}}})
    lines = TABLES["hub-latency"]([loaded, quiet])
    assert _cells(lines[0]) == ["model, load", "translator:iad", "hub iad", "fairseq's greedy (hub)", "ct2-best",
                                "against ct2-best: translator:iad, hub iad"]
    assert _cells(lines[2]) == ["9+3", "4.00 (3.50 / 0.50)", "8.00 (4.00 / 4.00)", "80.00 (76.00 / 4.00)",
                                "6.00 (int8, 1 thread)", "1.50x, 0.75x"]
    assert _cells(lines[3]) == ["9+3, loaded", "-", "12.00 (6.00 / 6.00)", "-", "9.00 (int8, 1 thread)", "-, 0.75x"]
    assert lines[-1] == ("Outputs: 9+3, equal to fairseq's greedy (hub)'s: translator:iad 200/200, hub iad 200/200, "
                         "ct2-best 180/200; 9+3, loaded, equal to hub iad's: ct2-best 170/200.")
