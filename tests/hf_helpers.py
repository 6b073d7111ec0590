"""What the tests of imported Hugging Face checkpoints share: transformers'
greedy ids, an imported directory loaded as fairseq loads it, decoding a
converted model in the decoding modes, the text a Translator gives."""
import argparse
import os

import torch

from helpers import make_sample, python, run, tool

L = 24  # output tokens before EOS is forced (fairseq's max_len_b; transformers' max_new_tokens - 1)
SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "debian-ende-sample", "test.tok.en")

# greedy search in every way it runs
MODES = {
    "fairseq greedy (torch)": dict(),
    "engine greedy": dict(decoding="iad", engine="native", max_draft_len=0),
    "engine IAD": dict(decoding="iad", engine="native"),
    "torch IAD": dict(decoding="iad", engine="torch"),
}


def vary(model, emb_std: float, eos_bias=None, eos: int = 2) -> None:
    """Random weights that give varied outputs, some ending before the length
    limit, as a trained model's: embeddings N(0, emb_std) with the pad row (1)
    zero, as training leaves it; where ``eos_bias`` is given, a final_logits_bias
    N(0, 1) plus ``eos_bias`` on EOS; layer norm weights U(0.5, 2)."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.normal_(0, emb_std)
        emb[1] = 0.0
        if eos_bias is not None:
            model.final_logits_bias.normal_(0, 1.0)
            model.final_logits_bias[0, eos] += eos_bias
        for n, p in model.named_parameters():
            if "layer_norm" in n and n.endswith("weight"):
                p.uniform_(0.5, 2.0)


def sample_lines():
    return open(SAMPLE, encoding="utf-8").read().splitlines()


def hf_ids(model, rows, pad: int, eos: int, **generate):
    """transformers' greedy token ids per sentence of one batch (after the start
    token, up to its EOS), the length limit L; ``generate``: its other arguments."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=L + 1,
                             **generate)
    got = []
    for row in out.tolist():
        row = row[1:]
        got.append(row[: row.index(eos) + 1] if eos in row else row)
    return got


def imported(hf_dir, out, source_lang="src", target_lang="tgt"):
    """(MODEL.json, fairseq model, task) of ``hf_dir`` imported into ``out``."""
    from fairseq import checkpoint_utils

    from fairseq_aggressive.hf import import_hf

    meta = import_hf(str(hf_dir), str(out), source_lang, target_lang)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "model.pt")],
                                                                    arg_overrides={"data": str(out)})
    return meta, models[0].eval(), task


def greedy_ids(task, model, rows, bsz: int, **opts):
    """The converted model's token ids, ``bsz`` sentences a batch, through the
    task's generator of ``opts`` (--min-len 0: transformers' generate may end a
    sentence at once)."""
    gen = task.build_generator([model], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0, **opts))
    got = []
    for i in range(0, len(rows), bsz):
        sample = make_sample(rows[i: i + bsz], task.target_dictionary.pad())
        got += [h[0]["tokens"].tolist() for h in task.inference_step(gen, [model], sample)]
    return got


def check_modes(task, model, rows, ref, modes=MODES):
    """Every mode's ids at batch 1 and 8 are ``ref``."""
    for mode, opts in modes.items():
        for bsz in (1, 8):
            assert greedy_ids(task, model, rows, bsz, **opts) == ref, (mode, bsz)


def check_translator(out, lines, want):
    """Translator on the imported directory ``out`` (the engine's IAD, alone and
    streamed, and fairseq's greedy) turns ``lines`` into ``want``; returns the
    engine's."""
    from fairseq_aggressive.translator import Translator

    engine = Translator.from_pretrained(str(out), decoding="iad", engine="native", max_len_a=0, max_len_b=L)
    fairseqs = Translator.from_pretrained(str(out), max_len_a=0, max_len_b=L)  # (fairseq's own greedy)
    for t in (engine, fairseqs):
        assert [t.translate(s) for s in lines] == want
    assert engine.running_decoder() is not None  # streamed through the engine's running batch
    assert engine.translate_batch(lines, rows=8) == want
    return engine


def int8_ids(hf_dir, tmp_path, rows, **langs):
    """The int8 model's greedy in torch (fairseq's generator) and the engine's IAD in int8."""
    outs = {}
    for name, opts in (("torch", dict(engine="torch")), ("engine IAD", dict(engine="native", decoding="iad"))):
        _, model, task = imported(hf_dir, tmp_path / name.replace(" ", "-"), **langs)  # (quantized in place)
        outs[name] = greedy_ids(task, model, rows, len(rows), inference_precision="int8", **opts)
    return outs


def bench(out, tmp_path, lines, encode, src="src", tgt="tgt", modes="greedy,iad,ct2", extra=()):
    """The bench on ``lines`` (``encode``: a line -> the source text to binarize)
    beside CTranslate2's conversion; its JSON."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    for side in (src, tgt):
        (data / f"test.{side}").write_text("".join(encode(s) + "\n" for s in lines))
    python([tool("fairseq-preprocess"), "-s", src, "-t", tgt, "--testpref", str(data / "test"),
            "--srcdict", str(out / f"dict.{src}.txt"), "--tgtdict", str(out / f"dict.{tgt}.txt"),
            "--destdir", str(data / "bin"), "--workers", "1"], check=True, capture_output=True)
    js = tmp_path / "b.json"
    run([tool("fairseq-aggressive-bench"), str(data / "bin"), "--path", str(out / "model.pt"),
         "--user-dir", "fairseq_aggressive", "--task", "aggressive_translation", "-s", src, "-t", tgt,
         "--gen-subset", "test", "--max-len-a", "0", "--max-len-b", str(L), "--min-len", "0", "--warmup", "2",
         "--threads", "1", "--batch-size", "4", "--bench-modes", modes, "--bench-json", str(js)] + list(extra))
    res = json.loads(js.read_text())
    for mode in modes.split(",")[1:]:
        if mode.startswith("ct2"):  # (other kernels: a near tie may flip one)
            assert res["modes"][mode]["identical_to_greedy"] >= len(lines) - 1, mode
        else:
            assert res["modes"][mode]["identical_to_greedy"] == len(lines), mode
    return res
