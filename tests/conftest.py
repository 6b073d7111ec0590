import os
import sys

import pytest

torch_threads = int(os.environ.get("TEST_THREADS", "2"))

import torch  # noqa: E402

torch.set_num_threads(torch_threads)
# the native engine on the same count: its thread pool takes part in every exactness test
# (the default policy gives small test models one thread; tests/test_threads.py checks it)
os.environ.setdefault("FAIRSEQ_AGGRESSIVE_NATIVE_THREADS", str(torch_threads))


def pytest_terminal_summary(terminalreporter):
    from helpers import ALL_COMPARISONS

    if ALL_COMPARISONS:
        tot = sum(c.total for c in ALL_COMPARISONS)
        ident = sum(c.identical for c in ALL_COMPARISONS)
        ties = sum(c.near_ties for c in ALL_COMPARISONS)
        bad = sum(len(c.failures) for c in ALL_COMPARISONS)
        terminalreporter.write_line(
            f"equivalence with stock greedy: {tot} hypotheses compared, {ident} identical "
            f"(tokens and scores), {ties} genuine near-ties, {bad} other differences"
        )


# ---------------------------------------------- models trained on the sample
# (minutes: the tests that use them are marked slow)


TINY = ["--encoder-layers", "2", "--decoder-layers", "1",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings", "--encoder-normalize-before", "--decoder-normalize-before"]
COMMON = ["--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt",
          "--warmup-updates", "50", "--max-tokens", "3000", "--dropout", "0",
          "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "simple",
          "--seed", "1"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny deep/shallow model trained for a few hundred updates on the sample."""
    from helpers import USER_DIR, run, tool

    work = tmp_path_factory.mktemp("cli")
    data = work / "data"
    run([sys.executable, "scripts/data/prepare_uagec.py", "--from-text", "data/uagec-sample",
         "--out", str(data), "--bpe-ops", "1000"])
    save = work / "ckpt"
    run([tool("fairseq-train"), str(data / "bin"), "--user-dir", USER_DIR,
         "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
         "--arch", "transformer_deep_shallow", *TINY, *COMMON,
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-update", "600", "--save-dir", str(save)])
    return data / "bin", save / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def trained_drafter(trained):
    """A block_nat drafter (k=4) trained with glat_block_loss on the same data,
    its encoder initialised from the AR model's.  Returns (checkpoint, log)."""
    from helpers import USER_DIR, run, tool

    data, ar_ckpt = trained
    save = ar_ckpt.parent.parent / "drafter"
    proc = run([tool("fairseq-train"), str(data), "--user-dir", USER_DIR,
                "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                "--arch", "block_nat", *TINY, *COMMON, "--criterion", "glat_block_loss",
                "--block-size", "4", "--glat-anneal-updates", "200", "--max-update", "200",
                "--log-interval", "20", "--init-encoder-from", str(ar_ckpt),
                "--save-dir", str(save)])
    return save / "checkpoint_last.pt", proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def trained_blockwise(trained):
    """Proposal heads (k=4) trained on top of the frozen AR model of ``trained``
    (the paper's 'regular' setting: only the new layer trains): decoded exactly,
    the result must be that AR model's greedy output.  Returns (checkpoint, log)."""
    from helpers import USER_DIR, run, tool

    data, ar_ckpt = trained
    save = ar_ckpt.parent.parent / "blockwise"
    proc = run([tool("fairseq-train"), str(data), "--user-dir", USER_DIR,
                "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                "--arch", "transformer_blockwise", "--blockwise-k", "4", *TINY, *COMMON,
                "--criterion", "blockwise_cross_entropy", "--max-update", "150", "--log-interval", "10",
                "--init-from-ar", str(ar_ckpt), "--freeze-base", "--save-dir", str(save)])
    return save / "checkpoint_last.pt", proc.stdout + proc.stderr
