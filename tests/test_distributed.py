"""fairseq's distributed training on CPU processes, for every training setup
the plugin registers: 2 processes (``torchrun``, gloo) train a few updates,
both ranks end with the same parameters (a checksum per rank), and the model
equals one process training the same batches with ``--update-freq 2`` (so the
gradients were averaged across the processes; parameters whose gradient is
analytically zero, trained on rounding noise alone, within the optimizer's
step bound).  Also ``fairseq-train
--distributed-world-size 2`` spawning its own processes, and sharded decoding
covering every sentence once with the unsharded output."""
import json
import os
import sys

import pytest
import torch

from tiny_model import COMMON, TINY
from helpers import USER_DIR, generate, run, tool

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

UPDATES = 4
# (--arch and --criterion options, needs the AR checkpoint)
SETUPS = {
    "deep-shallow": (["--arch", "transformer_deep_shallow", "--criterion", "label_smoothed_cross_entropy",
                      "--label-smoothing", "0.1"], None),
    "block_nat glat": (["--arch", "block_nat", "--criterion", "glat_block_loss", "--block-size", "4",
                        "--glat-anneal-updates", "2"], "--init-encoder-from"),
    # (its options include --shared-encoder and --block-causal-prefix: the drafter that trains no encoder)
    "block_nat verifier features": (
        ["--arch", "block_nat", "--criterion", "glat_block_loss", "--block-size", "4", "--shared-encoder",
         "--block-causal-prefix", "--verifier-features"], "--init-encoder-from"),
    "blockwise frozen base": (["--arch", "transformer_blockwise", "--blockwise-k", "4", "--criterion",
                               "blockwise_cross_entropy", "--freeze-base"], "--init-from-ar"),
    "blockwise fine-tuned": (["--arch", "transformer_blockwise", "--blockwise-k", "4", "--criterion",
                              "blockwise_cross_entropy"], "--init-from-ar"),
}


def _zero_gradient(name: str) -> bool:
    """A key projection's bias has an analytically zero gradient: softmax ignores a
    shift that every key of a query shares.  What it gets is rounding noise, which
    depends on the summation order (processes, CPU kernels) and which Adam scales
    into full-size steps."""
    return name.endswith("k_proj.bias")


def _noise_bound() -> float:
    """How far two runs can move a parameter apart on noise alone in UPDATES
    updates: each Adam step is at most lr * (1 - beta1) / sqrt(1 - beta2) = 3.17 lr
    (betas 0.9, 0.999) per run, lr warming up linearly from 0 (inverse_sqrt)."""
    lr, warmup = (float(COMMON[COMMON.index(k) + 1]) for k in ("--lr", "--warmup-updates"))
    return 2 * 3.17 * sum(lr * min(1.0, u / warmup) for u in range(1, UPDATES + 1))


def _train(data, save, opts, procs, extra=()):
    base = [str(data), "--user-dir", USER_DIR, "--task", "aggressive_translation", "--source-lang", "src",
            "--target-lang", "tgt", *TINY, *COMMON, "--max-tokens", "1500", "--max-update", str(UPDATES),
            "--save-dir", str(save), "--cpu", "--disable-validation", *opts, *extra]
    if procs == 1:
        cmd = [tool("fairseq-train"), *base, "--update-freq", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
               "--module", "fairseq_cli.train", *base]
    return run(cmd)


def _params(ckpt):
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    return state["model"], state["optimizer_history"][-1]["num_updates"]


@pytest.mark.parametrize("setup", list(SETUPS))
def test_two_processes_train_what_one_trains(setup, trained, tmp_path, monkeypatch):
    data, ar = trained
    opts, init = SETUPS[setup]
    opts = opts + ([init, str(ar)] if init else [])
    sums = tmp_path / "sums"
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_RANK_CHECKSUMS", str(sums))
    proc = _train(data, tmp_path / "two", opts, 2)
    monkeypatch.delenv("FAIRSEQ_AGGRESSIVE_RANK_CHECKSUMS")
    log = proc.stdout + proc.stderr
    assert "distributed init (rank 1)" in log, log[-3000:]
    ranks = [json.loads((sums / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["num_updates"] == UPDATES for r in ranks), ranks
    assert ranks[0]["sha256"] == ranks[1]["sha256"], "the ranks' parameters differ"
    _train(data, tmp_path / "one", opts, 1)
    two, n2 = _params(tmp_path / "two" / "checkpoint_last.pt")
    one, n1 = _params(tmp_path / "one" / "checkpoint_last.pt")
    assert n1 == n2 == UPDATES
    init_state = None
    if init:  # the parameters that train must have moved (else equality says nothing)
        init_state = torch.load(ar, map_location="cpu", weights_only=False)["model"]
    moved, noise = 0, _noise_bound()
    for name, p in one.items():
        if _zero_gradient(name):  # determined only up to the optimizer's step on noise
            assert float((p.float() - two[name].float()).abs().max()) <= noise, name
        else:
            assert torch.allclose(p.float(), two[name].float(), rtol=1e-4, atol=1e-6), name
        if init_state is not None and name in init_state and init_state[name].shape == p.shape:
            moved += not torch.equal(init_state[name], p)
    if init_state is not None and "--freeze-base" in opts:
        # the frozen base stays as loaded; the heads trained (the optimizer holds their gradients' moments)
        for name, p in one.items():
            if not name.startswith("blockwise_heads.") and name in init_state:
                assert torch.equal(init_state[name].to(p.dtype), p), name
        opt = torch.load(tmp_path / "two" / "checkpoint_last.pt", map_location="cpu",
                         weights_only=False)["last_optimizer_state"]["state"]
        assert opt and all(float(st["exp_avg"].abs().sum()) > 0 for st in opt.values())
    else:
        assert init_state is None or moved > 0


def test_world_size_on_one_machine_spawns_processes(trained, tmp_path, monkeypatch):
    """``fairseq-train --distributed-world-size 2`` without a launcher starts
    both processes itself (fairseq would start one per GPU: none on a CPU)."""
    data, _ = trained
    sums = tmp_path / "sums"
    opts, _ = SETUPS["deep-shallow"]
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_RANK_CHECKSUMS", str(sums))
    proc = run([tool("fairseq-train"), str(data), "--user-dir", USER_DIR, "--task", "aggressive_translation",
                "--source-lang", "src", "--target-lang", "tgt", *TINY, *COMMON, "--max-tokens", "1500",
                "--max-update", "2", "--save-dir", str(tmp_path / "ckpt"), "--cpu", "--disable-validation",
                "--distributed-world-size", "2", *opts])
    ranks = [json.loads((sums / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["sha256"] == ranks[1]["sha256"] and ranks[0]["world_size"] == 2, proc.stderr[-2000:]


@pytest.mark.parametrize("decoding", ["iad", "gad"])
def test_sharded_decoding_covers_every_sentence_once(decoding, trained, trained_drafter, trained_blockwise):
    data, ar = trained
    ckpt, extra = ar, []
    if decoding == "gad":
        extra = ["--drafter-path", str(trained_drafter)]
    if decoding == "blockwise":
        ckpt = trained_blockwise
    whole, _ = generate(data, ckpt, "--decoding", decoding, *extra)
    # fairseq-generate's own sharding: one shard per rank of a world
    shards = [generate(data, ckpt, "--decoding", decoding, *extra, "--distributed-world-size", "3",
                       "--distributed-rank", str(s))[0] for s in range(3)]
    seen = [i for s in shards for i in s]
    assert sorted(seen) == sorted(whole) and len(seen) == len(set(seen))
    assert {i: h for s in shards for i, h in s.items()} == whole


def test_distill_shards_cover_the_training_set_once(trained, tmp_path):
    """scripts/experiments/distill.py over 3 shards (fairseq-generate's own
    sharding) distills every training pair once: the same pairs as one shard."""
    from helpers import ROOT

    data, ckpt = trained
    text, small = data.parent, tmp_path / "small"
    small.mkdir()
    for split, n in (("train", 50), ("valid", 5), ("test", 5)):
        for lang in ("src", "tgt"):
            lines = (text / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (small / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run([sys.executable, "-m", "fairseq_cli.preprocess", "-s", "src", "-t", "tgt", "--trainpref",
         str(small / "train"), "--validpref", str(small / "valid"), "--testpref", str(small / "test"),
         "--srcdict", str(data / "dict.src.txt"), "--tgtdict", str(data / "dict.tgt.txt"),
         "--destdir", str(small / "bin"), "--workers", "1"])
    distill = os.path.join(ROOT, "scripts", "experiments", "distill.py")
    pairs = {}
    for shards in (1, 3):
        out = tmp_path / f"kd{shards}"
        run([sys.executable, distill, "--teacher", str(ckpt), "--data", str(small / "bin"), "--out", str(out),
             "--cpu", "--num-shards", str(shards), "--beam", "2"])
        srcs = (out / "train.distill.src").read_text(encoding="utf-8").splitlines()
        hyps = (out / "train.distill.tgt").read_text(encoding="utf-8").splitlines()
        pairs[shards] = sorted(zip(srcs, hyps))
    assert len(pairs[3]) == 50 and pairs[3] == pairs[1]
