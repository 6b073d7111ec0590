"""The translation configs' pipelines (scripts/experiments/pipeline.py + configs/translation/): the
ci scale end to end (a file of its own, beside tests/test_pipeline.py's GEC pipeline, so that
pytest-xdist runs the two on two workers at once), what the cpu scale trains, --models and
resuming, the other direction of a pair, checkpoint averaging; and every config's training
budgets in updates."""
import json
import os
import re
import sys

import pytest

from helpers import ROOT, run
from pipeline_helpers import CASE_IDS, CASES, dry_run, parse_with_fairseq, pipeline, run_pipeline


@pytest.mark.parametrize("config,scale", CASES, ids=CASE_IDS)
def test_budgets_in_updates_and_no_hidden_bf16(config, scale, tmp_path, monkeypatch):
    """Every training run is bounded by updates (the same model on every machine), never by
    wall clock; distillation by shards, not minutes; no config assumes a bfloat16 CPU."""
    cfg, pipe = dry_run(config, scale, tmp_path, monkeypatch)
    for argv in pipe.commands:
        flat = list(map(str, argv))
        assert "--stop-time-hours" not in flat and "--max-minutes" not in flat, flat
        assert "--cpu-bf16" not in flat and "--drafter-bf16" not in flat, flat
        if os.path.basename(flat[0]) == "fairseq-train":
            assert int(parse_with_fairseq(flat).max_update) > 0, flat


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_translation_pipeline_ci_scale_end_to_end(tmp_path):
    """Every translation step at toy size on the bundled sample: teacher -> Seq-KD -> block_nat
    drafter and blockwise heads (fine-tuned and frozen), a one-decoder-layer student on the
    teacher's outputs and its drafter on the student's own -> GAD, GAD++ and blockwise decoding of
    the whole test set -> BLEU -> benchmark; the exact modes equal their greedy decoding."""
    work = tmp_path / "mt"
    run_pipeline("translation/wmt14_ende.yaml", "ci", work)
    assert (work / "distill" / "bin" / "train.src-tgt.src.bin").exists()
    decode = json.loads((work / "results.json").read_text())["decode"]
    assert {"beam5", "greedy", "gad", "gad++-hq", "gad++-he", "blockwise-k4", "blockwise-k4-frozen"} <= set(decode)
    for row in decode.values():
        assert row["sentences"] == 300 and 0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["sacrebleu"] <= 100.0
    assert decode["gad"]["identical_to_greedy"] == 300
    assert decode["gad"]["bleu"] == decode["greedy"]["bleu"]
    # the table's BLEU is the console scorer's on the same output and references
    hyps, refs = pipeline.read_generate(work / "decode" / "greedy.txt")
    (tmp_path / "hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    out = run([os.path.join(os.path.dirname(sys.executable), "fairseq-aggressive-bleu"),
               str(tmp_path / "hyp.txt"), str(tmp_path / "ref.txt"), "--tokenized"]).stdout
    assert float(re.search(r"BLEU = ([\d.]+)", out).group(1)) == pytest.approx(decode["greedy"]["bleu"], abs=0.006)
    assert decode["blockwise-k4"]["identical_to_blockwise-k4-greedy"] == 300
    assert decode["blockwise-k4-frozen"]["identical_to_greedy"] == 300  # frozen base = the teacher
    # the student trained on the teacher's outputs, its drafter on the student's own: GAD is its greedy
    assert (work / "distill-student" / "bin" / "train.src-tgt.src.bin").exists()
    assert decode["student-gad"]["identical_to_student-greedy"] == 300
    assert decode["student-far"]["identical_to_student-greedy"] == 300  # the feature drafter too
    gad = json.loads((work / "bench-gad.json").read_text())["modes"]
    assert gad["gad"]["identical_to_greedy"] == 40
    heads = json.loads((work / "bench-blockwise-k4.json").read_text())["modes"]
    assert heads["blockwise"]["identical_to_greedy"] == 40
    assert heads["blockwise-min2"]["mean_tokens_per_pass"] > 1.5  # at least 2 a pass but the last
    student = json.loads((work / "bench-student-gad.json").read_text())["modes"]
    assert student["gad"]["identical_to_greedy"] == 40 and student["greedy-native"]["identical_to_greedy"] == 40
    assert student["feature-ar@4"]["identical_to_greedy"] == 40


def test_cpu_scale_ende_is_the_documented_run(tmp_path, monkeypatch):
    """`make ende-cpu` (wmt14_ende.yaml --scale cpu) trains what docs/results-debian-ende.md
    describes: teacher 6+6 d=128 for 4000 updates, self-distillation (greedy), drafter K=8 with 2
    causal-prefix layers on the teacher's frozen encoder and decoder features for 1500, heads k=2,4,8 on the teacher (frozen lr 1e-3, fine-tuned 1e-4) for 150 each, the
    6+1 student on the teacher's greedy outputs for 3000 and its drafters on the student's own, its
    heads k=8 on the frozen student for 1000 and then trained together with it for 400, and
    benchmarks every head set and GAD at batch 1 on 400 sentences."""
    cfg, pipe = dry_run(os.path.join(ROOT, "configs", "translation", "wmt14_ende.yaml"), "cpu", tmp_path, monkeypatch)
    train = {}
    for argv in pipe.commands:
        flat = list(map(str, argv))
        if os.path.basename(flat[0]) == "fairseq-train":
            train[os.path.basename(flat[flat.index("--save-dir") + 1])] = parse_with_fairseq(flat)
    teacher = train.pop("teacher")
    assert (teacher.arch, teacher.encoder_layers, teacher.decoder_layers, teacher.encoder_embed_dim,
            teacher.encoder_ffn_embed_dim, teacher.max_update, teacher.lr) == (
        "transformer_deep_shallow", 6, 6, 128, 512, 4000, [0.002])
    drafter = train.pop("drafter")
    assert (drafter.arch, drafter.encoder_layers, drafter.decoder_layers, drafter.block_size,
            drafter.max_update, drafter.shared_encoder, drafter.block_causal_prefix, drafter.verifier_features) == (
        "block_nat", 6, 2, 8, 1500, True, True, True)
    student, student_drafter, student_far = train.pop("student"), train.pop("student-drafter"), train.pop("student-far")
    assert (student_far.arch, student_far.criterion, student_far.encoder_layers, student_far.decoder_layers,
            student_far.max_update, student_far.feature_ar, student_far.verifier_features,
            student_far.block_causal_prefix) == ("block_nat", "feature_ar_loss", 6, 1, 1500, True, True, True)
    assert student_far.init_encoder_from.endswith("models/student/checkpoint_best.pt")
    assert (student.arch, student.encoder_layers, student.decoder_layers, student.encoder_embed_dim,
            student.max_update) == ("transformer_deep_shallow", 6, 1, 128, 3000)
    assert student_drafter.init_encoder_from.endswith("models/student/checkpoint_best.pt")
    assert (student_drafter.arch, student_drafter.encoder_layers, student_drafter.block_size,
            student_drafter.max_update, student_drafter.verifier_features) == ("block_nat", 6, 8, 1500, True)
    distill = [list(map(str, a)) for a in pipe.commands if str(a[1]).endswith("distill.py")]
    # the teacher's greedy outputs (the drafter's and the student's data), then the student's (its drafter's)
    assert [os.path.basename(a[a.index("--out") + 1]) for a in distill] == ["distill", "distill-student"]
    assert all(a[a.index("--beam") + 1] == "1" for a in distill)
    assert distill[1][distill[1].index("--teacher") + 1].endswith("models/student/checkpoint_best.pt")
    trained_on = {os.path.basename(str(a[a.index("--save-dir") + 1])): str(a[1]) for a in pipe.commands
                  if "--save-dir" in a}
    assert trained_on["student"].endswith("/distill/bin") and trained_on["student-drafter"].endswith(
        "/distill-student/bin") and trained_on["teacher"].endswith("/data/bin")
    assert drafter.init_encoder_from.endswith("models/teacher/checkpoint_best.pt")
    # the student's heads k=8: on the frozen student, then trained together from there
    heads_frozen, heads_both = train.pop("student-blockwise-frozen"), train.pop("student-blockwise")
    for a in (heads_frozen, heads_both):
        assert (a.arch, a.blockwise_k, a.blockwise_loss, a.encoder_layers, a.decoder_layers) == (
            "transformer_blockwise", 8, "per-position", 6, 1)
        assert trained_on[a.save_dir.rstrip("/").split("/")[-1]].endswith("/distill-student/bin")
    assert heads_frozen.freeze_base and not getattr(heads_both, "freeze_base", False)
    assert heads_frozen.init_from_ar.endswith("models/student/checkpoint_best.pt")
    assert heads_both.init_from_ar.endswith("models/student-blockwise-frozen/checkpoint_last.pt")
    assert (heads_frozen.max_update, heads_both.max_update) == (1000, 400)
    assert sorted(train) == [f"blockwise-k{k}{s}" for k in (2, 4, 8) for s in ("", "-frozen")]
    for name, a in train.items():
        assert a.init_from_ar.endswith("models/teacher/checkpoint_best.pt"), name
        assert (a.max_update, a.warmup_updates, getattr(a, "freeze_base", False), a.lr) == (
            150, 50, name.endswith("-frozen"), [1e-3 if name.endswith("-frozen") else 1e-4]), name
    benches = {os.path.basename(str(argv[argv.index("--bench-json") + 1])): list(map(str, argv))
               for argv in pipe.commands if os.path.basename(str(argv[0])) == "fairseq-aggressive-bench"}
    assert {f"bench-{m}.json" for m in train} <= set(benches)
    for flat in benches.values():
        assert flat[flat.index("--batch-size") + 1] == "1" and flat[flat.index("--threads") + 1] == "2"
        assert flat[flat.index("--bench-max-sentences") + 1] == "400"


def test_models_filter_and_resume(tmp_path, monkeypatch):
    """`--models teacher,drafter` trains and benchmarks only the GAD pair; a model
    whose checkpoints stop short of its budget resumes, one that reached it (or
    was finished before) is not retrained."""
    import torch

    cfg = pipeline.load_config(os.path.join(ROOT, "configs", "translation", "wmt14_ende.yaml"), "cpu")
    with pytest.raises(SystemExit, match="--models: no model nope"):
        pipeline.Pipeline(cfg, tmp_path, models=["teacher", "nope"])
    pipe = pipeline.Pipeline(cfg, tmp_path / "dry", dry_run=True, log=lambda *_: None, models=["teacher", "drafter"])
    pipe.train()
    pipe.bench()
    saves = [os.path.basename(str(a[a.index("--save-dir") + 1])) for a in pipe.commands if "--save-dir" in a]
    assert saves == ["teacher", "drafter"]
    benches = [os.path.basename(str(a[a.index("--bench-json") + 1])) for a in pipe.commands if "--bench-json" in a]
    grids = ["bench-table6-block-sizes.json"] + [f"bench-table7-top{b}-tau{t}.json" for b in (3, 5) for t in range(1, 6)]
    assert benches == ["bench-gad.json", "bench-gad++-he.json"] + grids  # GAD Tables 6 and 7 need the same pair

    calls, lines = [], []
    pipe = pipeline.Pipeline(cfg, tmp_path / "w", log=lines.append, models=["teacher"])
    monkeypatch.setattr(pipe, "run", lambda argv, **kw: calls.append(argv))
    save = tmp_path / "w" / "models" / "teacher"
    save.mkdir(parents=True)
    budget = int(cfg["models"]["teacher"]["options"]["max-update"])
    for updates, runs in ((1200, 1), (budget, 0)):
        for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
            torch.save({"optimizer_history": [{"num_updates": updates}]}, save / name)
        (save / "TRAINED").unlink(missing_ok=True)
        calls.clear()
        pipe.train_model("teacher", cfg["models"]["teacher"])
        assert len(calls) == runs and (save / "TRAINED").exists()
        calls.clear()
        pipe.train_model("teacher", cfg["models"]["teacher"])  # finished: nothing runs
        assert calls == []
    assert any("resuming after 1200 updates" in line for line in lines)

    # a budget raised after the model finished: training resumes from its last checkpoint
    (save / "TRAINED").write_text(f"{budget - 1000} updates\n")
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        torch.save({"optimizer_history": [{"num_updates": budget - 1000}]}, save / name)
    calls.clear()
    pipe.train_model("teacher", cfg["models"]["teacher"])
    assert len(calls) == 1 and (save / "TRAINED").read_text() == f"{budget} updates\n"
    assert any(f"raised from {budget - 1000} to {budget}" in line for line in lines)
    assert any(f"resuming after {budget - 1000} updates" in line for line in lines)


def test_the_other_direction_of_a_language_pair(tmp_path):
    """--direction ro-en: the config's directions: entry on top (languages, the paper's
    settings of that direction), references of its target language."""
    path = os.path.join(ROOT, "configs", "translation", "wmt16_enro.yaml")
    own = pipeline.load_config(path, "paper")
    assert own["direction"] == "en-ro" and own["decode"]["modes"]["gad++-hq"]["gad-tau"] == 4.0
    assert pipeline.load_config(path, "paper", "en-ro") == own
    cfg = pipeline.load_config(path, "paper", "ro-en")
    assert (cfg["src"], cfg["tgt"], cfg["direction"]) == ("ro", "en", "ro-en")
    assert cfg["decode"]["modes"]["gad++-hq"]["gad-beta"] == 3 and cfg["decode"]["modes"]["gad++-hq"]["gad-tau"] == 2.0
    assert cfg["bench"]["gad++-he"]["gad-tau"] == 3.0
    pipe = pipeline.Pipeline(cfg, tmp_path, dry_run=True, log=lambda _: None)
    assert pipe.expand(cfg["evaluate"]["sacrebleu-reference"]) == str(tmp_path / "data" / "test.raw.en")
    pipe.train()
    train = [list(map(str, a)) for a in pipe.commands if os.path.basename(str(a[0])) == "fairseq-train"]
    assert train and all(a[a.index("--source-lang") + 1] == "ro" for a in train)
    ende = pipeline.load_config(os.path.join(ROOT, "configs", "translation", "wmt14_ende.yaml"), "cpu", "de-en")
    assert (ende["src"], ende["tgt"], ende["evaluate"]["compound-split"]) == ("de", "en", False)
    with pytest.raises(SystemExit, match="has no direction 'fr-en' \\(it has: en-ro, ro-en\\)"):
        pipeline.load_config(path, "paper", "fr-en")


def test_averaged_checkpoints_where_the_paper_averages(tmp_path):
    """GAD's verifier and drafter (average-last: 10): trained with interval checkpoints, averaged
    after training, and decoded with the average; the small scales keep their last checkpoint."""
    path = os.path.join(ROOT, "configs", "translation", "wmt14_ende.yaml")
    pipe = pipeline.Pipeline(pipeline.load_config(path, "paper"), tmp_path, dry_run=True, log=lambda _: None)
    pipe.train()
    flat = [list(map(str, a)) for a in pipe.commands]
    avg = [a for a in flat if a[1].endswith("average_checkpoints.py")]
    assert [a[2] for a in avg] == [str(tmp_path / "models" / n) for n in ("verifier", "drafter", "verifier-big",
                                                                          "drafter-big")]
    train = next(a for a in flat if "--save-dir" in a and a[a.index("--save-dir") + 1].endswith("verifier"))
    assert flat.index(avg[0]) > flat.index(train)  # averaged once trained
    assert "--keep-interval-updates" in train and int(train[train.index("--keep-interval-updates") + 1]) >= 10
    assert str(pipe.checkpoint("verifier")).endswith("verifier/checkpoint_avg10.pt")
    cpu = pipeline.Pipeline(pipeline.load_config(path, "cpu"), tmp_path / "cpu", dry_run=True, log=lambda _: None)
    assert str(cpu.checkpoint("drafter")).endswith("drafter/checkpoint_last.pt")
