"""CTranslate2 as a benchmark baseline: conversion cached beside the
checkpoint, decoding in a process of its own, outputs compared with fairseq
greedy, clear errors."""
import json
import os

import pytest

from helpers import run, tool

from fairseq_aggressive.bench import ct2 as ct2_bench


def bench(data, ckpt, out, modes, n, bsz):
    return run([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "test",
                "--remove-bpe", "--bench-max-sentences", str(n), "--warmup", "2", "--threads", "1",
                "--batch-size", str(bsz), "--bench-modes", modes, "--bench-json", str(out)])


@pytest.mark.slow
def test_bench_ct2_modes(trained, tmp_path):
    data, ckpt = trained
    js = tmp_path / "b1.json"
    proc = bench(data, ckpt, js, "greedy,iad,iad@3,iad@1024,ct2,ct2-int8", 30, 1)
    res = json.loads(js.read_text())
    # iad@L: drafts of at most L tokens, still greedy's output
    capped, iad, uncapped = res["modes"]["iad@3"], res["modes"]["iad"], res["modes"]["iad@1024"]
    assert capped["identical_to_greedy"] == iad["identical_to_greedy"] == uncapped["identical_to_greedy"] == 30
    assert capped["drafted"] <= 3 * capped["decoder_passes"] < uncapped["drafted"]
    ct2, int8 = res["modes"]["ct2"], res["modes"]["ct2-int8"]
    # CTranslate2 float32 greedy is fairseq greedy (other kernels: a near tie may flip one)
    assert ct2["identical_to_greedy"] >= 29, ct2
    # int8 is another model (13 of 30 identical on this briefly trained fixture), not noise
    assert int8["identical_to_greedy"] >= 5, int8
    assert ct2["total_s"] > 0 and int8["total_s"] > 0 and ct2["mean_passes_per_sentence"] > 1
    assert "| ct2 |" in proc.stdout and "| ct2-int8 |" in proc.stdout
    for r in res["per_sentence"]:
        assert r["ct2"]["tokens"][-1] == r["greedy"]["tokens"][-1]  # both end with EOS

    # converted once, cached beside the checkpoint, reused by the next run (batch 4)
    cache = ckpt.parent / (ckpt.name + ".ct2")
    stamp = json.loads((cache / "SOURCE.json").read_text())
    assert stamp["checkpoint"] == str(ckpt) and (cache / "model.bin").is_file()
    before = (cache / "model.bin").stat().st_mtime_ns
    js4 = tmp_path / "b4.json"
    bench(data, ckpt, js4, "greedy,ct2", 30, 4)
    assert (cache / "model.bin").stat().st_mtime_ns == before
    assert json.loads(js4.read_text())["modes"]["ct2"]["identical_to_greedy"] >= 29


@pytest.mark.slow
def test_bench_ct2_best_configuration(trained, tmp_path):
    """ct2-best times every compute type CTranslate2 supports on this CPU at 1, 2, 4 ...
    threads on the first sentences, decodes the run with the fastest, and the
    x ct2 column is against the fastest CTranslate2 mode of the run."""
    data, ckpt = trained
    js = tmp_path / "best.json"
    proc = bench(data, ckpt, js, "greedy,iad,ct2,ct2-best", 30, 1)
    res = json.loads(js.read_text())
    best = res["modes"]["ct2-best"]
    config = best["ct2_config"]
    types = ct2_bench.compute_types()
    assert "float32" in types and "int8" in types
    counts = ct2_bench.thread_counts(os.cpu_count())
    assert sorted((c["compute_type"], c["threads"]) for c in config["configs"]) == sorted(
        (t, n) for t in types for n in counts)
    chosen = min(config["configs"], key=lambda c: c["seconds"])
    assert (config["compute_type"], config["threads"]) == (chosen["compute_type"], chosen["threads"])
    assert best["total_s"] > 0 and len(res["per_sentence"]) == 30
    if config["compute_type"] == "float32":  # float32 greedy is fairseq's (up to a near tie)
        assert best["identical_to_greedy"] >= 29, best
    fastest = res["ct2_fastest"]
    assert fastest in ("ct2", "ct2-best")
    assert res["modes"][fastest]["speedup_vs_ct2"] == 1.0
    thr = f"{config['threads']} thread{'s' if config['threads'] > 1 else ''}"
    assert f"| ct2-best ({config['compute_type']}, {thr}) |" in proc.stdout


def test_ct2_thread_counts_and_probe():
    assert ct2_bench.thread_counts(1) == [1]
    assert ct2_bench.thread_counts(2) == [1, 2]
    assert ct2_bench.thread_counts(6) == [1, 2, 4, 6]
    batches = [{"tokens": [["a"]] * 3, "max_len": 5} for _ in range(20)]
    assert len(ct2_bench.probe_batches(batches, 7)) == 3  # 9 sentences: the first batches past 7
    assert len(ct2_bench.probe_batches(batches[:1], 40)) == 1


def test_ct2_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ct2_bench.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ct2_bench.CT2Error, match=r"pip install 'fairseq-aggressive\[ct2\]'"):
        ct2_bench.require()


@pytest.mark.slow
def test_ct2_bad_checkpoint_leaves_nothing(tmp_path, trained):
    data, _ = trained
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ct2_bench.CT2Error, match="could not convert"):
        ct2_bench.converted_model(str(bad), str(data))
    assert sorted(os.listdir(tmp_path)) == ["broken.pt"]
