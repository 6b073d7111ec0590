"""BART checkpoints imported (fairseq_aggressive.hf): small random models
shaped like bart-base (post-norm, gelu, a layer norm on the embeddings,
unscaled embeddings, final_logits_bias, <s> forced first as bart-large's
generation config says) with a byte-level BPE trained here.  Greedy decoding
through fairseq's own generator, the native engine, its running batch and IAD
gives transformers' own generate(num_beams=1) token ids and text on every
sentence, at batch 1 and 8."""
import json
import os

import pytest
import torch

from hf_helpers import MODES, bench, check_modes, check_translator, hf_ids, imported, int8_ids, sample_lines, vary

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """(HF directory, transformers model, tokenizer, held-out English lines)."""
    tmp = tmp_path_factory.mktemp("bart")
    lines = sample_lines()
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
    cfg = transformers.BartConfig(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=128, activation_function="gelu",
                                  scale_embedding=False, init_std=0.3,
                                  normalize_before=False, add_final_layer_norm=False)  # (bart-base's config.json)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    vary(model, 0.5, eos_bias=4.0)
    model.generation_config.forced_bos_token_id = 0  # (as bart-large's)
    model.generation_config.forced_eos_token_id = 2
    model.save_pretrained(hf)
    return hf, model, tok, lines[-40:]


def test_converted_bart_decodes_as_transformers(bart, tmp_path):
    hf, model, tok, lines = bart
    meta, fs, task = imported(hf, tmp_path / "out")
    assert meta["imported_from"]["model_type"] == "bart" and meta["text"]["bpe"] == "hf_gpt2"
    rows = [tok(s)["input_ids"] for s in lines[:24]]
    ref = [h for i in range(0, len(rows), 8) for h in hf_ids(model, rows[i : i + 8], 1, 2)]  # in batches of 8
    assert all(r[0] == 0 for r in ref) and len({tuple(r) for r in ref}) > 16  # <s> forced first, varied
    assert any(len(r) <= 24 for r in ref) and any(len(r) > 24 for r in ref)
    assert [hf_ids(model, [r], 1, 2)[0] for r in rows[:8]] == ref[:8]  # transformers' batch 1 agrees with its 8
    check_modes(task, fs, rows, ref, MODES)


@pytest.mark.slow  # (the fast tier reads text through Marian's tokenizer: test_hf_import)
def test_text_through_the_translator_is_transformers(bart, tmp_path):
    """Sentences through Translator (static and streamed): transformers'
    tokenizer ids (<s> first) and its decoded greedy outputs."""
    hf, model, tok, lines = bart
    imported(hf, tmp_path / "out")
    rows = [tok(s)["input_ids"] for s in lines]
    want = [tok.decode(o, skip_special_tokens=True) for o in hf_ids(model, rows, 1, 2)]
    t = check_translator(tmp_path / "out", lines, want)
    assert [t.encode(s).tolist() for s in lines] == rows
    assert len(set(want)) > 10


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_int8_and_the_bench_beside_ctranslate2(bart, tmp_path):
    """int8 on the engine (IAD) is the int8 model's own greedy (fairseq's
    generator, <s> its prefix token); text binarized as GPT-2 BPE ids with <s>
    first decodes in the bench as fairseq's greedy and CTranslate2's conversion
    of the same checkpoint do (its tokens mapped to the dictionary's numbers,
    <s> its target prefix)."""
    pytest.importorskip("ctranslate2")
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    hf, model, tok, lines = bart
    outs = int8_ids(hf, tmp_path, [tok(s)["input_ids"] for s in lines[:16]])
    assert outs["engine IAD"] == outs["torch"] and all(o[0] == 0 for o in outs["torch"])
    out = tmp_path / "out"
    imported(hf, out)
    enc = get_encoder(str(out / "bpe.vocab.json"), str(out / "bpe.merges.txt"))
    bench(out, tmp_path, lines, lambda s: "<s> " + " ".join(map(str, enc.encode(s))))


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
