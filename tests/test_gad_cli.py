"""GAD end to end with the stock CLIs on the bundled sample: a block_nat drafter
(glat_block_loss, encoder initialised from the AR model; tests/tiny_model.py),
fairseq-generate / fairseq-interactive / hub API with --decoding gad, greedy
equivalence on the trained pair, GAD++, the benchmark's gad modes."""
import json
import os
import re

import pytest

from helpers import ROOT, USER_DIR, compare, generate, python, run, sample_test_size, tool

DISTILL = os.path.join(ROOT, "scripts", "experiments", "distill.py")

# trains models on the sample (conftest.py's `trained`): minutes
pytestmark = pytest.mark.slow


def summary(proc):
    m = re.search(r"aggressive decoding \(gad\): (\d+) sentences, (\d+) decoder passes.*?"
                  r"([\d.]+) tokens accepted per pass, (\d+)/(\d+) drafted", proc.stderr)
    assert m, proc.stderr[-2000:]
    return int(m.group(1)), float(m.group(3)), int(m.group(4))


def test_generate_gad_equals_greedy(trained, trained_drafter, trained_greedy):
    data, ckpt = trained
    drafter, greedy = trained_drafter, trained_greedy
    gad, proc = generate(data, ckpt, "--decoding", "gad", "--drafter-path", str(drafter))
    assert len(greedy) == sample_test_size() and set(greedy) == set(gad)
    same = sum(greedy[k] == gad[k] for k in greedy)
    assert same == len(greedy), f"{len(greedy) - same} of {len(greedy)} GAD hypotheses differ from greedy"
    n, per_pass, accepted = summary(proc)
    assert n == len(greedy) and per_pass > 1.0 and accepted > 0
    # GAD++ with a generous rule accepts more drafted tokens per pass
    pp, proc = generate(data, ckpt, "--decoding", "gad", "--drafter-path", str(drafter),
                        "--gad-beta", "5", "--gad-tau", "5")
    assert set(pp) == set(greedy)
    assert summary(proc)[1] > per_pass


def test_gad_equivalence_on_trained_pair(trained, trained_drafter):
    """Hypotheses and scores of exact GAD vs stock greedy on the trained
    verifier/drafter pair, batch 1 and 8, K in {1, 2, 5, 25}."""
    import fairseq_aggressive  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq_aggressive.drafters import NARBlockDrafter
    from fairseq_aggressive.generator import build_generator

    data, ckpt = trained
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    drafter_model, trained_k = task.load_drafter(str(trained_drafter), like=model)
    assert trained_k == 4
    d = task.target_dictionary
    task.load_dataset("valid")
    ds = task.dataset("valid")
    ref_gen = SequenceGenerator([model], d, beam_size=1)
    for k, bsz, n in ((1, 8, 32), (2, 1, 16), (5, 8, 96), (25, 8, 32), (4, 1, 24)):
        gen = build_generator([model], d, NARBlockDrafter(drafter_model, d, k))
        cmp = None
        for i in range(0, n, bsz):
            sample = ds.collater([ds[j] for j in range(i, i + bsz)])
            cmp = compare(model, sample, ref_gen.generate([model], sample), gen.generate([model], sample), cmp)
        assert cmp.ok(), (k, bsz, cmp)
        assert cmp.identical >= cmp.total - 1, cmp
        assert gen.stats.accepted > 0


def test_interactive_and_hub_gad(trained, trained_drafter):
    from fairseq.models.transformer import TransformerModel

    import fairseq_aggressive  # noqa: F401

    data, ckpt = trained
    drafter = str(trained_drafter)
    lines = [l.strip() for l in open(os.path.join(ROOT, "data/uagec-sample/test.tok.src"), encoding="utf-8")][:15]
    outs = {}
    for mode in ("beam", "gad"):
        proc = run([tool("fairseq-interactive"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
                    "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                    "--beam", "1", "--decoding", mode, "--drafter-path", drafter, "--bpe", "subword_nmt",
                    "--bpe-codes", str(data.parent / "bpe.codes")],
                   input="\n".join(lines) + "\n")
        outs[mode] = re.findall(r"^D-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)
    assert len(outs["gad"]) == 15 and outs["gad"] == outs["beam"]

    hub = TransformerModel.from_pretrained(str(ckpt.parent), checkpoint_file=ckpt.name,
                                           data_name_or_path=str(data), bpe="subword_nmt",
                                           bpe_codes=str(data.parent / "bpe.codes"))
    assert hub.translate(lines, beam=1, decoding="gad", drafter_path=drafter, block_size=3) == \
        hub.translate(lines, beam=1)
    with pytest.raises(ValueError, match="--drafter-path"):
        hub.translate(lines[:1], beam=1, decoding="gad")
    with pytest.raises(ValueError, match="--gad-beta"):
        hub.translate(lines[:1], beam=1, decoding="gad", drafter_path=drafter, gad_beta=0)


def test_cli_refuses_bad_drafters(trained, trained_drafter, monkeypatch, capsys):
    """fairseq-generate refuses each bad drafter setting before it decodes: the first case
    as a command (its exit status and message), the others through fairseq-generate's own
    entry point in this process (the same code without a process's start: 6 s each)."""
    import sys

    from fairseq_cli.generate import cli_main

    from helpers import BIN

    data, ckpt = trained
    base = [str(data), "--user-dir", USER_DIR, "--task", "aggressive_translation", "--gen-subset", "test",
            "--beam", "1"]
    cases = [
        (["--path", str(ckpt), "--decoding", "gad"], "--drafter-path"),
        (["--path", str(ckpt), "--decoding", "gad", "--drafter-path", str(ckpt)], "block_nat"),
        (["--path", str(trained_drafter)], "drafter"),
        (["--path", str(ckpt), "--decoding", "gad", "--drafter-path", str(trained_drafter),
          "--gad-tau", "-1"], "--gad-tau"),
    ]
    proc = python([os.path.join(BIN, "fairseq-generate"), *base, *cases[0][0]], capture_output=True,
                  text=True, cwd=ROOT)
    assert proc.returncode != 0 and cases[0][1] in proc.stderr, proc.stderr[-1500:]
    assert not re.search(r"^H-", proc.stdout, re.M)
    for extra, msg in cases:
        monkeypatch.setattr(sys, "argv", ["fairseq-generate", *base, *extra])
        with pytest.raises(Exception) as refused:
            cli_main()
        out = capsys.readouterr()
        assert msg in str(refused.value) + out.err, (extra, refused.value, out.err[-1500:])
        assert not re.search(r"^H-", out.out, re.M)


def test_bench_gad_modes(trained, trained_drafter, tmp_path):
    data, ckpt = trained
    js = tmp_path / "bench.json"
    proc = run([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "valid",
                "--remove-bpe", "--bench-max-sentences", "24", "--warmup", "1", "--threads", "1",
                "--batch-size", "4", "--drafter-path", str(trained_drafter),
                "--bench-modes", "greedy,gad,gad@2,gad++@4", "--bench-json", str(js)])
    res = json.loads(js.read_text())["modes"]
    assert res["gad"]["identical_to_greedy"] == 24 and res["gad@2"]["identical_to_greedy"] == 24
    assert res["gad"]["mean_tokens_per_pass"] > 1.0 and res["gad"]["accepted"] > 0
    assert 0 < res["gad"]["draft_time_share"] < 1
    assert res["gad++@4"]["accepted"] >= res["gad"]["accepted"]
    assert "| gad++@4 |" in proc.stdout


def test_distill_script(trained, tmp_path):
    """Seq-KD: one shard of the training set decoded by the teacher, binarized with
    the teacher's dictionaries; the targets are the teacher's outputs."""
    import sys

    data, ckpt = trained
    out = tmp_path / "kd"
    proc = run([sys.executable, DISTILL, "--teacher", str(ckpt), "--data", str(data),
                "--out", str(out), "--cpu", "--num-shards", "16", "--shard-ids", "3", "--beam", "2"])
    assert "distilled" in proc.stdout
    for lang in ("src", "tgt"):
        assert (out / "bin" / f"dict.{lang}.txt").read_text() == (data / f"dict.{lang}.txt").read_text()
        assert (out / "bin" / f"train.src-tgt.{lang}.bin").exists()
        assert (out / "bin" / f"valid.src-tgt.{lang}.idx").exists()
    hyps = (out / "train.distill.tgt").read_text(encoding="utf-8").splitlines()
    srcs = (out / "train.distill.src").read_text(encoding="utf-8").splitlines()
    assert 20 < len(hyps) == len(srcs) < 4000
    # the distilled targets are what fairseq-generate printed for those sources
    gen = (out / "generate.train.shard3.txt").read_text(encoding="utf-8")
    printed = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", gen, re.M))
    assert sorted(hyps) == sorted(printed.values())
    # refuses to overwrite
    again = python([sys.executable, DISTILL, "--teacher", str(ckpt), "--data", str(data),
                    "--out", str(out), "--cpu"], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode != 0 and "exists" in again.stderr


@pytest.mark.e2e  # (training a drafter, then decoding through the command line)
def test_shared_encoder_drafter_end_to_end(trained, trained_greedy, tmp_path):
    """fairseq-train of a drafter that reads the verifier's encoder
    (--shared-encoder --block-causal-prefix): the encoder (and the tied
    embeddings) stay the verifier's, validation logs per-slot accuracy and the
    leading run; fairseq-generate --decoding gad with it equals greedy, on the
    native engine, on torch and with the drafter shortlist."""
    import torch

    data, ckpt = trained
    save = tmp_path / "shared"
    from tiny_model import COMMON, TINY

    proc = run([tool("fairseq-train"), str(data), "--user-dir", USER_DIR,
                "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                "--arch", "block_nat", *TINY, *COMMON, "--criterion", "glat_block_loss",
                "--block-size", "4", "--glat-anneal-updates", "100", "--max-update", "100",
                "--log-interval", "20", "--init-encoder-from", str(ckpt), "--shared-encoder",
                "--block-causal-prefix", "--save-dir", str(save)])
    log = proc.stdout + proc.stderr
    valid = [line for line in log.splitlines() if "valid on 'valid' subset" in line]
    assert valid and all(f"acc{i} " in valid[-1] for i in (1, 2, 3, 4)) and "| lead " in valid[-1], log[-2000:]
    drafter = save / "checkpoint_last.pt"
    theirs = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]
    ours = torch.load(drafter, map_location="cpu", weights_only=False)["model"]
    enc = [k for k in ours if k.startswith("encoder.") and k in theirs]
    assert enc and all(torch.equal(ours[k], theirs[k]) for k in enc)
    greedy = trained_greedy
    for extra in (["--engine", "auto"], ["--engine", "torch"], ["--drafter-shortlist", "100"]):
        gad, proc = generate(data, ckpt, "--decoding", "gad", "--drafter-path", str(drafter), *extra)
        assert gad == greedy, extra
        assert summary(proc)[2] > 0
