"""The reproduction pipelines (scripts/experiments/pipeline.py + configs/): every config at every scale
produces commands that stock fairseq's own parsers accept, bad configs fail clearly, and
the shortest pipeline (GEC on the bundled sample) runs end to end.  The translation pipeline and
the translation configs' runs: tests/test_pipeline_translation.py."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT, run
from pipeline_helpers import (CASE_IDS, CASES, CONFIGS, LICENSED_ENV, PIPELINE, dry_run, parse_with_fairseq,
                              pipeline, run_pipeline)


def test_configs_found():
    names = {os.path.relpath(c, ROOT) for c in CONFIGS}
    assert {"configs/translation/wmt14_ende.yaml", "configs/translation/wmt16_enro.yaml",
            "configs/gec/bea19.yaml"} <= names


@pytest.mark.parametrize("config,scale", CASES, ids=CASE_IDS)
def test_commands_parse_with_fairseq(config, scale, tmp_path, monkeypatch):
    cfg, pipe = dry_run(config, scale, tmp_path, monkeypatch)
    tools = [os.path.basename(a[0]) for a in pipe.commands]
    assert tools.count("fairseq-train") == len([m for m in cfg["models"].values() if not m.get("same-as")])
    assert "fairseq-generate" in tools and "fairseq-aggressive-bench" in tools
    checked = 0
    for argv in pipe.commands:
        args = parse_with_fairseq(argv)
        if args is None:
            script = argv[1]
            assert os.path.isfile(script), f"{script} does not exist"
            continue
        checked += 1
        assert not any("{" in a and "}" in a and not a.startswith("(") for a in argv), argv
        if os.path.basename(argv[0]) == "fairseq-train":
            assert args.task == "aggressive_translation" and args.save_dir.startswith(str(tmp_path))
    assert checked >= 3


@pytest.mark.parametrize("config,scale", [(c, s) for c, s in CASES if s != "paper"])
def test_small_scales_need_no_licensed_data_or_gpu(config, scale, tmp_path, monkeypatch):
    for k in LICENSED_ENV:
        monkeypatch.delenv(k, raising=False)
    cfg = pipeline.load_config(config, scale)
    pipe = pipeline.Pipeline(cfg, tmp_path, dry_run=True, log=lambda _: None)
    for step in pipeline.STEPS:
        getattr(pipe, step)()
    flat = [a for argv in pipe.commands for a in map(str, argv)]
    assert "--fp16" not in flat and "--distributed-world-size" not in flat


def test_scripts_have_no_wall_clock_budgets():
    shell_scripts = glob.glob(os.path.join(ROOT, "scripts", "**", "*.sh"), recursive=True)
    for path in shell_scripts + [os.path.join(ROOT, "Makefile")]:
        text = open(path, encoding="utf-8").read()
        assert "stop-time-hours" not in text and "max-minutes" not in text, path
        assert "--cpu-bf16" not in text.replace("CPU_BF16=--cpu-bf16", ""), path


def test_scripts_share_code_through_the_package():
    """What the scripts share is imported from the package (fairseq_aggressive.data_prep,
    fairseq_aggressive.diagnostics.loading): no script or test puts a folder on sys.path."""
    paths = glob.glob(os.path.join(ROOT, "scripts", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "tests", "*.py"))
    for path in paths:
        text = open(path, encoding="utf-8").read()
        assert not re.search(r"sys\.path\.(insert|append)\(|sys\.path \+?=", text), path


def test_paper_gec_needs_the_licensed_paths(tmp_path, monkeypatch):
    for k in LICENSED_ENV:
        monkeypatch.delenv(k, raising=False)
    cfg = pipeline.load_config(os.path.join(ROOT, "configs", "gec", "bea19.yaml"), "paper")
    pipe = pipeline.Pipeline(cfg, tmp_path, dry_run=True, log=lambda _: None)
    with pytest.raises(SystemExit, match=r"\$\{LANG8_M2\}"):
        pipe.prepare()


def test_config_errors(tmp_path):
    with pytest.raises(SystemExit, match="no config"):
        pipeline.load_config(tmp_path / "missing.yaml", "paper")
    with pytest.raises(SystemExit, match="no scale 'huge'"):
        pipeline.load_config(os.path.join(ROOT, "configs", "gec", "bea19.yaml"), "huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: translation\nsrc: en\ntgt: de\nprepare: [x.py]\n"
                   "models:\n  a: {options: {init-from-ar: '{nosuch}'}}\n")
    pipe = pipeline.Pipeline(pipeline.load_config(bad, "paper"), tmp_path, dry_run=True, log=lambda _: None)
    with pytest.raises(SystemExit, match="'{nosuch}' names no model"):
        pipe.train()
    bad.write_text("kind: speech\nsrc: en\ntgt: de\nprepare: [x.py]\nmodels: {}\n")
    bad.write_text("kind: translation\nsrc: en\ntgt: de\nprepare: [x.py]\n"
                   "models:\n  a: {options: {}}\n  b: {data: 'distill:nosuch'}\n")
    pipe = pipeline.Pipeline(pipeline.load_config(bad, "paper"), tmp_path, dry_run=True, log=lambda _: None)
    with pytest.raises(SystemExit, match="raw, distill or distill:MODEL"):
        pipe.train()
    bad.write_text("kind: speech\nsrc: en\ntgt: de\nprepare: [x.py]\nmodels: {}\n")
    with pytest.raises(SystemExit, match="kind must be"):
        pipeline.load_config(bad, "paper")
    proc = subprocess.run([sys.executable, PIPELINE,
                           os.path.join(ROOT, "configs", "gec", "bea19.yaml"), "--steps", "train,fly"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown step(s) fly" in proc.stderr


def test_option_args():
    argv = pipeline.option_args({"lr": 5e-4, "fp16": True, "bf16": False, "clip-norm": None,
                                 "adam-betas": "(0.9, 0.98)", "ks": [2, 4]})
    assert argv == ["--lr", "0.0005", "--fp16", "--adam-betas", "(0.9, 0.98)", "--ks", "2", "4"]
    merged = pipeline.deep_merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"c": None}, "e": 4})
    assert merged == {"a": {"b": 1, "c": None}, "d": 3, "e": 4}


def m2_cli(hyps, gold, tmp_path):
    path = tmp_path / "hyps.txt"
    path.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    out = run([os.path.join(os.path.dirname(sys.executable), "fairseq-aggressive-m2"), str(path), str(gold)]).stdout
    return {k.strip(): float(v) for k, v in (line.split(":") for line in out.strip().splitlines())}


def differences_are_near_ties(work, subset):
    """The sentences of ``subset`` whose IAD output differs from fairseq's greedy
    (decoded again as the pipeline's ci scale decodes, BPE kept), each checked to
    be a genuine near-tie: greedy's top-2 log-prob gap at the first differing
    token below NEAR_TIE on the checkpoint's full forward pass (the model of a
    minute's training is nearly flat, and a machine whose torch rounds otherwise
    can meet one); any other difference fails.  Returns how many differ."""
    import torch
    from fairseq import checkpoint_utils

    from helpers import BIN, NEAR_TIE, USER_DIR, _top2_gap

    ckpt, data = work / "models" / "9x3" / "checkpoint_best.pt", work / "data" / "bin"
    hyps = {}
    for extra in ([], ["--decoding", "iad"]):
        out = run([os.path.join(BIN, "fairseq-generate"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
                   "--task", "aggressive_translation", "-s", "src", "-t", "tgt", "--gen-subset", subset, "--beam", "1",
                   "--max-tokens", "4000", "--max-len-a", "1.2", "--max-len-b", "10", *extra]).stdout
        hyps[bool(extra)] = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, re.M))
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(data)})
    model, d = models[0].eval(), task.target_dictionary
    task.load_dataset(subset)
    differ = [i for i in hyps[False] if hyps[False][i] != hyps[True][i]]
    for i in differ:
        g, a = ([d.index(w) for w in h.split()] + [d.eos()] for h in (hyps[False][i], hyps[True][i]))
        k = next(j for j, (x, y) in enumerate(zip(g, a)) if x != y)
        src = task.dataset(subset)[int(i)]["source"]
        sample = {"net_input": {"src_tokens": src.unsqueeze(0), "src_lengths": torch.tensor([len(src)])}}
        gap = _top2_gap(model, sample, 0, g[:k], d.eos())
        assert gap < NEAR_TIE, (subset, i, k, gap, hyps[False][i], hyps[True][i])
    return len(differ)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_gec_pipeline_ci_scale_end_to_end(tmp_path):
    """The shortest pipeline, as CI runs it: sample -> BPE/binarize -> 9+3 for a minute ->
    greedy / IAD on the whole test set -> M2 F0.5 and GLEU -> benchmark (beam 5, greedy, IAD)."""
    work = tmp_path / "gec"
    proc = run_pipeline("gec/bea19.yaml", "ci", work)
    results = json.loads((work / "results.json").read_text())
    decode = results["decode"]
    assert set(decode) == {"9x3-greedy", "9x3-iad", "9x3-greedy-valid", "9x3-iad-valid"}
    n_test = 300  # and 300 in the validation split, scored against its own gold (CoNLL-13's place)
    for row in decode.values():
        assert row["sentences"] == n_test
        assert 0.0 <= row["f0.5"] <= 1.0 and 0.0 <= row["gleu"] <= 1.0
    for subset, iad, ref in (("test", "9x3-iad", "9x3-greedy"), ("valid", "9x3-iad-valid", "9x3-greedy-valid")):
        same = decode[iad][f"identical_to_{ref}"]
        assert same == n_test or differences_are_near_ties(work, subset) == n_test - same
    assert (work / "gold-valid.m2").exists() and decode["9x3-greedy-valid"]["f0.5"] != decode["9x3-greedy"]["f0.5"]
    # the table's M2 numbers are the console scorer's on the same output
    greedy = pipeline.read_generate(work / "decode" / "9x3-greedy.txt")[0]
    cli = m2_cli(greedy, work / "gold-test.m2", tmp_path)
    assert cli["Precision"] == pytest.approx(decode["9x3-greedy"]["precision"], abs=1e-4)
    assert cli["F_0.5"] == pytest.approx(decode["9x3-greedy"]["f0.5"], abs=1e-4)
    bench = json.loads((work / "bench-9x3.json").read_text())
    assert bench["modes"]["iad"]["identical_to_greedy"] == bench["sentences"] == 30
    assert set(bench["modes"]) == {"beam5", "greedy", "iad"}
    assert "| 9x3-iad | 300 |" in (work / "results.md").read_text()
    # a second run finds every output and runs nothing
    again = run_pipeline("gec/bea19.yaml", "ci", work)
    assert "$ " not in again.stdout and "found" in again.stdout
