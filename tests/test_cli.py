"""End to end with the stock CLIs on the bundled UA-GEC sample:
prepare -> fairseq-train -> fairseq-generate / fairseq-interactive (--decoding iad)
-> equivalence of IAD with greedy on the trained checkpoint -> benchmark."""
import json
import os
import re

import pytest

from helpers import NATIVE_REASON, ROOT, USER_DIR, generate, needs_native, run, sample_test_size, tool

# trains a model on the sample (conftest.py's `trained`): minutes
pytestmark = pytest.mark.slow


def test_generate_iad_equals_greedy(trained, trained_greedy):
    data, ckpt = trained
    greedy = trained_greedy
    # uncapped drafts verified as made (not the engine's draft-length budget): how much it copies
    iad, proc = generate(data, ckpt, "--decoding", "iad", "--max-draft-len", "1024", "--draft-cost", "off")
    # every test sentence is decoded: stock fairseq drops a last batch that is not a multiple
    # of --required-batch-size-multiple (300 = 18 x 16 + 8 + 4: 4 lost); our task keeps it
    assert len(greedy) == sample_test_size() == 300 and set(greedy) == set(iad)
    same = sum(greedy[k] == iad[k] for k in greedy)
    assert same == len(greedy), f"{len(greedy) - same} of {len(greedy)} IAD hypotheses differ from greedy"
    summary = re.search(r"aggressive decoding \(iad\): (\d+) sentences, (\d+) decoder passes.*?"
                        r"([\d.]+) tokens accepted per pass", proc.stderr)
    assert summary, proc.stderr[-2000:]
    assert int(summary.group(1)) == len(greedy)
    # the fixture learned what these tests rely on: it copies its input, so IAD accepts long
    # drafts (3.37 tokens per pass on an AVX2 machine; a broken training path gives ~1)
    assert float(summary.group(3)) >= 2.0, summary.group(0)
    # the default engine (auto) is the compiled one wherever it builds
    from fairseq_aggressive.native import available

    assert ("verifier: the native engine" in proc.stderr) == (available() is None), proc.stderr[-2000:]
    torch_iad, proc = generate(data, ckpt, "--decoding", "iad", "--engine", "torch")
    assert torch_iad == iad and "native engine" not in proc.stderr
    default_iad, _ = generate(data, ckpt, "--decoding", "iad")  # on the native engine: its draft-length budget
    assert default_iad == iad


def test_iad_equivalence_on_trained_model(trained):
    """Hypotheses and scores of IAD vs stock greedy, batch 1 and 8, on the
    trained checkpoint (it copies most of its input: long drafts get accepted)."""
    import fairseq_aggressive  # noqa: F401
    from fairseq import checkpoint_utils
    from helpers import compare
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq.sequence_generator import SequenceGenerator

    data, ckpt = trained
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    d = task.target_dictionary
    accepted = 0
    ref_gen = SequenceGenerator([model], d, beam_size=1)  # max_len_a 0: a sentence's output is its own
    for split in ("test", "valid"):
        task.load_dataset(split)
        ds = task.dataset(split)
        refs = {}  # batch 8's references by sentence id, each sentence's (helpers.greedy_rows) for batch 1 too
        for bsz in (8, 1):
            gen = build_generator([model], d, InputCopyDrafter(d, d))
            cmp = None
            n = 300 if bsz == 8 else 120
            for i in range(0, n, bsz):
                sample = ds.collater([ds[j] for j in range(i, min(i + bsz, n))])  # (sorted by length)
                ids = sample["id"].tolist()
                if bsz == 8:
                    refs.update(zip(ids, ref_gen.generate([model], sample)))
                ref = [refs[k] for k in ids]
                cmp = compare(model, sample, ref, gen.generate([model], sample), cmp)
            assert cmp.ok(), cmp
            assert cmp.identical >= cmp.total - 2, cmp
            accepted += gen.stats.accepted
    assert accepted > 0


def test_interactive_iad(trained):
    data, ckpt = trained
    lines = [l.strip() for l in open(os.path.join(ROOT, "data/uagec-sample/test.tok.src"), encoding="utf-8")][:20]
    outs = {}
    for mode in ("beam", "iad"):
        proc = run([tool("fairseq-interactive"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
                    "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
                    "--beam", "1", "--decoding", mode, "--bpe", "subword_nmt",
                    "--bpe-codes", str(data.parent / "bpe.codes")],
                   input="\n".join(lines) + "\n")
        outs[mode] = re.findall(r"^D-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)
    assert len(outs["iad"]) == 20
    assert outs["iad"] == outs["beam"]


def test_bench_cli(trained, tmp_path):
    data, ckpt = trained
    js, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = run([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "test",
                "--remove-bpe", "--bench-max-sentences", "40", "--warmup", "2", "--threads", "1",
                "--bench-json", str(js), "--bench-plot", str(png)])
    res = json.loads(js.read_text())
    assert res["sentences"] == 40
    assert res["modes"]["iad"]["identical_to_greedy"] >= 39
    assert res["modes"]["greedy"]["identical_to_greedy"] == 40
    assert "speedup_vs_beam5" in res["modes"]["iad"] and png.stat().st_size > 1000
    assert "| iad |" in proc.stdout
    # the machine is named with every result
    import torch

    assert res["machine"]["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert {"cpu_model", "native_bf16", "torch", "fairseq", "torch_threads"} <= set(res["machine"])
    assert "machine: " in proc.stdout and "native bf16" in proc.stdout


def test_bench_int8_modes(trained, tmp_path):
    """--inference-precision int8 end to end through the bench: IAD of the int8
    model against greedy of the same int8 model, and the change against float32."""
    from fairseq_aggressive.native import available

    data, ckpt = trained
    js = tmp_path / "bench.json"
    native = available() is None
    modes = "greedy,greedy-int8,iad-int8" + (",greedy-native-int8" if native else "")
    proc = run([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "test",
                "--remove-bpe", "--bench-max-sentences", "40", "--warmup", "2", "--threads", "1",
                "--bench-modes", modes, "--bench-json", str(js)])
    res = json.loads(js.read_text())
    rows = res["per_sentence"]
    if native:  # the engine's int8 IAD is its int8 greedy, bit for bit
        assert all(r["iad-int8"]["tokens"] == r["greedy-native-int8"]["tokens"] for r in rows)
    # against fairseq's greedy of the same int8 model: identical but for a near-tie flipped by an
    # activation rounding (tests/test_int8.py checks the gaps of such differences)
    assert res["modes"]["iad-int8"]["identical_to_greedy"] >= 39
    assert res["modes"]["greedy-int8"]["identical_to_greedy"] == 40
    assert 0 < res["modes"]["greedy-int8"]["identical_to_fp32_greedy"] <= 40
    assert "=fp32" in proc.stdout and "| iad-int8 |" in proc.stdout


def test_hub_api_iad(trained):
    from fairseq.models.transformer import TransformerModel

    import fairseq_aggressive  # noqa: F401

    data, ckpt = trained
    hub = TransformerModel.from_pretrained(str(ckpt.parent), checkpoint_file=ckpt.name,
                                           data_name_or_path=str(data), bpe="subword_nmt",
                                           bpe_codes=str(data.parent / "bpe.codes"))
    lines = [l.strip() for l in open(os.path.join(ROOT, "data/uagec-sample/valid.tok.src"), encoding="utf-8")][:10]
    assert hub.translate(lines, beam=1, decoding="iad") == hub.translate(lines, beam=1)
    # --beam N > 1: the engine's beam search, drafted (fairseq's beam's output); not on the torch path
    if NATIVE_REASON is None:
        assert hub.translate(lines, beam=4, decoding="iad") == hub.translate(lines, beam=4)
    with pytest.raises(ValueError, match="runs in the native engine"):
        hub.translate(lines[:1], beam=5, decoding="iad", engine="torch")
    with pytest.raises(ValueError, match="--iad-branches 2 is not supported with --decoding iad --beam N"):
        hub.translate(lines[:1], beam=5, decoding="iad", iad_branches=2)


def test_generate_beam_on_the_engine(trained):
    """fairseq-generate --beam 4 --nbest 2 with --engine native: fairseq's own beam's
    hypotheses, in its order, every test sentence; with --decoding iad (drafted)
    the same; int8 at --beam 1 the engine's greedy."""
    from fairseq_aggressive.evaluation.generate_output import parse_generate_lines

    data, ckpt = trained

    def beam(*extra):
        proc = run([tool("fairseq-generate"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
                    "--task", "aggressive_translation", "--gen-subset", "test", "--beam", "4", "--nbest", "2",
                    "--batch-size", "16", "--lenpen", "0.8", "--max-len-a", "1.2", "--max-len-b", "10", *extra])
        hyps = {}
        for line in proc.stdout.splitlines():
            if line.startswith("H-"):
                key, score, text = line.split("\t")
                hyps.setdefault(key, []).append((float(score), text))
        return hyps

    fairseq, ours = beam(), beam("--engine", "native")
    assert len(fairseq) == sample_test_size() and set(fairseq) == set(ours)
    differ = [k for k in fairseq if [t for _, t in fairseq[k]] != [t for _, t in ours[k]]]
    assert not differ, f"{len(differ)} sentences differ, e.g. {fairseq[differ[0]]} / {ours[differ[0]]}"
    assert all(abs(a - b) < 1e-4 for k in fairseq for (a, _), (b, _) in zip(fairseq[k], ours[k]))
    # drafted beam search (--decoding iad --beam N): the engine's beam search's hypotheses and scores
    assert beam("--engine", "native", "--decoding", "iad", "--max-draft-len", "6") == ours
    # int8: beam 1 on the engine is the engine's greedy (the int8 torch model's float parts
    # are not the engine's bit for bit, so quantized activations can round apart from it:
    # tests/test_beam_native.py compares with it on random models)
    int8_beam1 = beam("--inference-precision", "int8", "--engine", "native", "--beam", "1", "--nbest", "1")
    int8_greedy = beam("--inference-precision", "int8", "--decoding", "iad", "--max-draft-len", "0", "--beam", "1",
                       "--nbest", "1")
    assert set(int8_beam1) == set(int8_greedy)
    assert all(int8_beam1[k][0][1] == int8_greedy[k][0][1] for k in int8_greedy)


@needs_native
def test_bench_stream_modes(trained, tmp_path):
    """-stream modes: every sentence through --batch-size rows of the engine's running batch,
    each its greedy output, the passes and counters recorded as the batch modes'."""
    data, ckpt = trained
    js = tmp_path / "bench.json"
    run([tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "test",
         "--remove-bpe", "--bench-max-sentences", "40", "--warmup", "2", "--threads", "1", "--batch-size", "8",
         "--bench-modes", "greedy,greedy-int8,greedy-native,iad,iad-stream,greedy-native-stream,iad-int8-stream,"
         "greedy-native-int8",
         "--bench-json", str(js)])
    res = json.loads(js.read_text())
    rows = res["per_sentence"]
    assert len(rows) == 40
    for r in rows:  # the engine's greedy at batch 8 (each row its own length limit streamed; the same here)
        assert r["iad-stream"]["tokens"] == r["greedy-native-stream"]["tokens"] == r["iad"]["tokens"]
        assert r["iad-int8-stream"]["tokens"] == r["greedy-native-int8"]["tokens"]
    for m in ("iad-stream", "greedy-native-stream", "iad-int8-stream"):
        assert res["modes"][m]["identical_to_greedy"] >= 39
        assert res["modes"][m]["mean_ms_per_sentence"] > 0
    assert res["modes"]["greedy-native-stream"]["mean_passes_per_sentence"] > res["modes"]["iad-stream"]["mean_passes_per_sentence"]


def test_bench_stream_needs_the_engines_loop():
    from fairseq_aggressive.bench.modes import mode_overrides

    class Args:
        engine = "auto"
        bench_shortlist = None
        drafter_path = None

    assert mode_overrides("iad-stream", Args())["bench_stream"] is True
    for bad in ("greedy-stream", "iad-torch-stream", "iad-pyloop-stream", "beam5-stream"):
        with pytest.raises(SystemExit, match="-stream applies"):
            mode_overrides(bad, Args())
