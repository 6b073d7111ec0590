"""BART checkpoints imported (fairseq_aggressive.hf): small random models
shaped like bart-base (post-norm, gelu, a layer norm on the embeddings,
unscaled embeddings, final_logits_bias, <s> forced first as bart-large's
generation config says) with a byte-level BPE trained here.  Greedy decoding
through fairseq's own generator, the native engine, its running batch and IAD
gives transformers' own generate(num_beams=1) token ids and text on every
sentence, at batch 1 and 8."""
import argparse
import json
import os

import pytest
import torch

from helpers import make_sample

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
tokenizers = pytest.importorskip("tokenizers")

L = 24  # output tokens before EOS is forced (fairseq's max_len_b; transformers' max_new_tokens - 1)
SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "debian-ende-sample", "test.tok.en")


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """(HF directory, transformers model, tokenizer, held-out English lines)."""
    tmp = tmp_path_factory.mktemp("bart")
    lines = open(SAMPLE, encoding="utf-8").read().splitlines()
    bl = tokenizers.ByteLevelBPETokenizer()
    bl.train_from_iterator(lines[:-40], vocab_size=400, min_frequency=2, show_progress=False)
    bl.save_model(str(tmp))
    trained = json.loads((tmp / "vocab.json").read_text())
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3,  # fairseq's first four, as BART's vocab.json has them
             **{t: i + 4 for i, t in enumerate(sorted(trained, key=trained.get))}}
    vocab["<mask>"] = len(vocab)
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "vocab.json").write_text(json.dumps(vocab))
    (hf / "merges.txt").write_text((tmp / "merges.txt").read_text())
    merges = [tuple(m.split()) for m in (tmp / "merges.txt").read_text().splitlines()[1:] if m]
    tok = transformers.BartTokenizer(vocab=vocab, merges=merges)
    V = len(vocab)
    cfg = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=128, activation_function="gelu",
                                  scale_embedding=False, init_std=0.3,
                                  normalize_before=False, add_final_layer_norm=False)  # (bart-base's config.json)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # varied outputs, some ending before the length limit, as a trained model's
        emb = model.get_input_embeddings().weight
        emb.normal_(0, 0.5)
        emb[1] = 0.0  # the pad row stays zero in training (padding_idx)
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, 2] += 4.0
        for n, p in model.named_parameters():
            if "layer_norm" in n and n.endswith("weight"):
                p.uniform_(0.5, 2.0)
    model.generation_config.forced_bos_token_id = 0  # (as bart-large's)
    model.generation_config.forced_eos_token_id = 2
    model.save_pretrained(hf)
    return hf, model, tok, lines[-40:]


def hf_greedy(model, tok, rows):
    """transformers' greedy token ids per sentence (after the start token, up to its EOS)."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=L + 1)
    got = []
    for row in out.tolist():
        row = row[1:]
        got.append(row[: row.index(2) + 1] if 2 in row else row)
    return got


def imported(bart, tmp_path):
    from fairseq import checkpoint_utils

    from fairseq_aggressive.hf import import_hf

    out = tmp_path / "out"
    meta = import_hf(str(bart[0]), str(out))
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "model.pt")],
                                                                    arg_overrides={"data": str(out)})
    return out, meta, models[0].eval(), task


MODES = {
    "fairseq greedy (torch)": dict(),
    "engine greedy": dict(decoding="iad", engine="native", max_draft_len=0),
    "engine IAD": dict(decoding="iad", engine="native"),
    "torch IAD": dict(decoding="iad", engine="torch"),
}


def test_converted_bart_decodes_as_transformers(bart, tmp_path):
    hf, model, tok, lines = bart
    out, meta, fs, task = imported(bart, tmp_path)
    assert meta["imported_from"]["model_type"] == "bart" and meta["text"]["bpe"] == "hf_gpt2"
    rows = [tok(s)["input_ids"] for s in lines[:24]]
    ref = [hf_greedy(model, tok, [r])[0] for r in rows]
    assert all(r[0] == 0 for r in ref) and len({tuple(r) for r in ref}) > 16  # <s> forced first, varied
    assert any(len(r) <= L for r in ref) and any(len(r) > L for r in ref)
    assert hf_greedy(model, tok, rows[:8]) == ref[:8]  # transformers' batch of 8 agrees with its batch 1
    for mode, opts in MODES.items():
        gen = task.build_generator([fs], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0, **opts))
        for bsz in (1, 8):
            got = []
            for i in range(0, len(rows), bsz):
                sample = make_sample(rows[i: i + bsz], task.target_dictionary.pad())
                got += [h[0]["tokens"].tolist() for h in task.inference_step(gen, [fs], sample)]
            assert got == ref, (mode, bsz)


def test_text_through_the_translator_is_transformers(bart, tmp_path):
    """Sentences through Translator (static and streamed): transformers'
    tokenizer ids (<s> first) and its decoded greedy outputs."""
    from fairseq_aggressive.translator import Translator

    hf, model, tok, lines = bart
    out, *_ = imported(bart, tmp_path)
    want = []
    for line in lines:
        ids = tok(line)["input_ids"]
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=L + 1)[0].tolist()
        want.append((ids, tok.decode(gen, skip_special_tokens=True)))
    for settings in (dict(decoding="iad", engine="native", max_len_a=0, max_len_b=L),
                     dict(max_len_a=0, max_len_b=L)):  # (fairseq's own greedy)
        t = Translator.from_pretrained(str(out), **settings)
        assert [t.hub.encode(s).tolist() for s in lines] == [ids for ids, _ in want]
        assert [t.translate(s) for s in lines] == [text for _, text in want], settings
        if "decoding" in settings:  # streamed through the engine's running batch
            assert t.running_decoder() is not None
            assert t.translate_batch(lines, rows=8) == [text for _, text in want]
    assert len({text for _, text in want}) > 10


def test_refused_and_nothing_written(bart, tmp_path):
    from fairseq_aggressive.hf import ConversionError, import_hf

    hf = bart[0]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json", "merges.txt"):
        if (hf / name).exists():
            (broken / name).write_bytes((hf / name).read_bytes())
    vocab = json.loads((hf / "vocab.json").read_text())
    vocab["<s>"], vocab["<pad>"] = 1, 0
    (broken / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ConversionError, match="id 0 is '<pad>'"):
        import_hf(str(broken), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".import")]


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_int8_generate_and_the_bench_beside_ctranslate2(bart, tmp_path):
    """int8 on the engine (IAD) is the int8 model's own greedy (fairseq's
    generator, <s> its prefix token); text binarized as GPT-2 BPE ids with <s>
    first decodes in the bench as CTranslate2's conversion of the same
    checkpoint does (its tokens mapped to the dictionary's numbers, <s> its
    target prefix), and as fairseq's greedy."""
    pytest.importorskip("ctranslate2")
    import subprocess

    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    from helpers import run, tool

    hf, model, tok, lines = bart
    out, _, fs, task = imported(bart, tmp_path)
    rows = [tok(s)["input_ids"] for s in lines[:16]]
    outs = {}
    for name, opts in (("torch", dict(engine="torch")), ("engine IAD", dict(engine="native", decoding="iad"))):
        fs8, task8 = imported(bart, tmp_path / name.replace(" ", "-"))[2:]
        gen = task8.build_generator([fs8], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0,
                                                              inference_precision="int8", **opts))
        sample = make_sample(rows, task8.target_dictionary.pad())
        outs[name] = [h[0]["tokens"].tolist() for h in task8.inference_step(gen, [fs8], sample)]
    assert outs["engine IAD"] == outs["torch"] and all(o[0] == 0 for o in outs["torch"])
    enc = get_encoder(str(out / "bpe.vocab.json"), str(out / "bpe.merges.txt"))
    data = tmp_path / "data"
    data.mkdir()
    for side in ("src", "tgt"):
        (data / f"test.{side}").write_text("".join("<s> " + " ".join(map(str, enc.encode(s))) + "\n" for s in lines))
    subprocess.run([tool("fairseq-preprocess"), "-s", "src", "-t", "tgt", "--testpref", str(data / "test"),
                    "--srcdict", str(out / "dict.src.txt"), "--tgtdict", str(out / "dict.tgt.txt"),
                    "--destdir", str(data / "bin"), "--workers", "1"], check=True, capture_output=True)
    js = tmp_path / "b.json"
    run([tool("fairseq-aggressive-bench"), str(data / "bin"), "--path", str(out / "model.pt"),
         "--user-dir", "fairseq_aggressive", "--task", "aggressive_translation", "-s", "src", "-t", "tgt",
         "--gen-subset", "test", "--max-len-a", "0", "--max-len-b", str(L), "--min-len", "0", "--warmup", "2",
         "--threads", "1", "--batch-size", "4", "--bench-modes", "greedy,iad,ct2", "--bench-json", str(js)])
    res = json.loads(js.read_text())
    assert res["modes"]["iad"]["identical_to_greedy"] == len(lines)
    assert res["modes"]["ct2"]["identical_to_greedy"] >= len(lines) - 1  # (other kernels: a near tie may flip one)
