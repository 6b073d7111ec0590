"""Blockwise end to end with the stock CLIs on the bundled sample: heads trained
on a frozen AR model (tests/tiny_model.py), fairseq-generate / fairseq-interactive / hub API with
--decoding blockwise, the approximate rules, the benchmark's blockwise modes."""
import json
import os
import re

import pytest

from helpers import BIN, ROOT, USER_DIR, generate, python, run, sample_test_size, tool

# trains models on the sample (conftest.py's `trained`): minutes
pytestmark = pytest.mark.slow


def per_pass(proc):
    m = re.search(r"aggressive decoding \(blockwise\): (\d+) sentences.*?([\d.]+) tokens accepted per pass",
                  proc.stderr)
    assert m, proc.stderr[-2000:]
    return int(m.group(1)), float(m.group(2))


def test_generate_blockwise_equals_base_greedy(trained, trained_blockwise, trained_greedy):
    data, _ = trained
    bw = trained_blockwise
    base_greedy = trained_greedy                       # the AR model the heads sit on
    as_beam, _ = generate(data, bw)                    # --decoding beam: the base model
    exact, proc = generate(data, bw, "--decoding", "blockwise")
    assert len(base_greedy) == sample_test_size()
    assert as_beam == base_greedy
    assert exact == base_greedy
    n, exact_pp = per_pass(proc)
    assert n == len(base_greedy) and exact_pp > 1.0
    # approximate rules accept more per pass
    _, proc = generate(data, bw, "--decoding", "blockwise", "--blockwise-topk", "3")
    assert per_pass(proc)[1] > exact_pp
    _, proc = generate(data, bw, "--decoding", "blockwise", "--min-block-size", "3")
    assert per_pass(proc)[1] > max(exact_pp, 2.0)  # >= 3 per pass after the first


def test_interactive_hub_and_errors_blockwise(trained, trained_blockwise):
    from fairseq.models.transformer import TransformerModel

    import fairseq_aggressive  # noqa: F401

    data, ar_ckpt = trained
    bw = trained_blockwise
    lines = [l.strip() for l in open(os.path.join(ROOT, "data/uagec-sample/test.tok.src"), encoding="utf-8")][:12]
    outs = {}
    for mode in ("beam", "blockwise"):
        proc = run([tool("fairseq-interactive"), str(data), "--path", str(bw), "--user-dir", USER_DIR,
                    "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                    "--beam", "1", "--decoding", mode, "--bpe", "subword_nmt",
                    "--bpe-codes", str(data.parent / "bpe.codes")], input="\n".join(lines) + "\n")
        outs[mode] = re.findall(r"^D-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)
    assert len(outs["blockwise"]) == 12 and outs["blockwise"] == outs["beam"]
    hub = TransformerModel.from_pretrained(str(bw.parent), checkpoint_file=bw.name, data_name_or_path=str(data),
                                           bpe="subword_nmt", bpe_codes=str(data.parent / "bpe.codes"))
    assert hub.translate(lines, beam=1, decoding="blockwise") == hub.translate(lines, beam=1)
    with pytest.raises(ValueError, match="larger than the block size"):
        hub.translate(lines[:1], beam=1, decoding="blockwise", min_block_size=5)
    # a model without heads is refused before anything is decoded
    proc = python([os.path.join(BIN, "fairseq-generate"), str(data), "--path", str(ar_ckpt),
                   "--user-dir", USER_DIR, "--task", "aggressive_translation", "--beam", "1",
                   "--gen-subset", "test", "--decoding", "blockwise"],
                  capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "proposal heads" in proc.stderr
    assert not re.search(r"^H-", proc.stdout, re.M)


def test_bench_blockwise_modes(trained_blockwise, trained, tmp_path):
    data, _ = trained
    js = tmp_path / "bench.json"
    run([tool("fairseq-aggressive-bench"), str(data), "--path", str(trained_blockwise), "--gen-subset", "valid",
         "--remove-bpe", "--bench-max-sentences", "24", "--warmup", "1", "--threads", "1",
         "--bench-modes", "greedy,blockwise,blockwise-top3,blockwise-min2", "--bench-json", str(js)])
    res = json.loads(js.read_text())["modes"]
    assert res["blockwise"]["identical_to_greedy"] == 24
    assert res["blockwise"]["mean_tokens_per_pass"] > 1.0
    assert res["blockwise-top3"]["accepted"] >= res["blockwise"]["accepted"]
    assert res["blockwise-min2"]["mean_tokens_per_pass"] > max(1.5, res["blockwise"]["mean_tokens_per_pass"])
