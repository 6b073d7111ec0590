"""mBART checkpoints imported (fairseq_aggressive.hf): small random models
shaped like mbart-large-cc25 (pre-norm, gelu, scaled embeddings, a layer norm
on the embeddings and a final one on each side, final_logits_bias), with a
SentencePiece unigram model trained here under both of transformers' mBART
tokenizers: cc25's (the source language after EOS, decoding from the target
language's token) and mBART-50's (the source language first, the target's
forced first).  Greedy decoding through fairseq's own generator, the native
engine, its running batch and IAD gives transformers' own generate(num_beams=1)
token ids and text on every sentence, at batch 1 and 8."""
import argparse
import os

import pytest
import torch

from helpers import make_sample

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
pytest.importorskip("google.protobuf", reason="transformers reads a SentencePiece model with protobuf")

L = 24  # output tokens before EOS is forced (fairseq's max_len_b; transformers' max_new_tokens - 1)
SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "debian-ende-sample", "test.tok.en")
TOKENIZERS = ["MBartTokenizer", "MBart50Tokenizer"]


@pytest.fixture(scope="module", params=TOKENIZERS)
def mbart(request, tmp_path_factory):
    """(HF directory, transformers model, tokenizer, generate()'s language arguments, held-out lines)."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("mbart")
    lines = open(SAMPLE, encoding="utf-8").read().splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines[:-40]), model_prefix=str(tmp / "sp"),
                                   vocab_size=300, model_type="unigram", minloglevel=2)  # (as mBART's)
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "sentencepiece.bpe.model").write_bytes((tmp / "sp.model").read_bytes())
    getattr(transformers, request.param).from_pretrained(str(hf), bos_token="<s>").save_pretrained(str(hf))
    tok = transformers.AutoTokenizer.from_pretrained(str(hf), src_lang="en_XX", tgt_lang="de_DE")
    assert type(tok).__name__ == request.param
    de = tok.convert_tokens_to_ids("de_DE")
    lang = dict(decoder_start_token_id=de) if request.param == "MBartTokenizer" else dict(forced_bos_token_id=de)
    cfg = transformers.MBartConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=128, activation_function="gelu",
                                   scale_embedding=True, init_std=1.0, decoder_start_token_id=2,  # (mBART-50's)
                                   normalize_before=True, add_final_layer_norm=True,  # (mbart-large-cc25's config.json)
                                   tokenizer_class=request.param)
    torch.manual_seed(0)
    model = transformers.MBartForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # varied outputs, some ending before the length limit, as a trained model's
        emb = model.get_input_embeddings().weight
        emb.normal_(0, 0.1)
        emb[1] = 0.0  # the pad row stays zero in training (padding_idx)
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, 2] += {"MBartTokenizer": 3.5, "MBart50Tokenizer": 2.5}[request.param]
        for n, p in model.named_parameters():
            if "layer_norm" in n and n.endswith("weight"):
                p.uniform_(0.5, 2.0)
    model.save_pretrained(hf)
    return hf, model, tok, lang, lines[-40:]


def hf_generate(model, tok, lang, rows):
    """transformers' greedy token ids per sentence (after the start token, up to its EOS)."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=L + 1,
                             forced_eos_token_id=2, **lang)
    got = []
    for row in out.tolist():
        row = row[1:]
        got.append(row[: row.index(2) + 1] if 2 in row else row)
    return got


def imported(mbart, tmp_path):
    from fairseq import checkpoint_utils

    from fairseq_aggressive.hf import import_hf

    out = tmp_path / "out"
    meta = import_hf(str(mbart[0]), str(out), "en_XX", "de_DE")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "model.pt")],
                                                                    arg_overrides={"data": str(out)})
    return out, meta, models[0].eval(), task


MODES = {
    "fairseq greedy (torch)": dict(),
    "engine greedy": dict(decoding="iad", engine="native", max_draft_len=0),
    "engine IAD": dict(decoding="iad", engine="native"),
    "torch IAD": dict(decoding="iad", engine="torch"),
}


def test_converted_mbart_decodes_as_transformers(mbart, tmp_path):
    hf, model, tok, lang, lines = mbart
    out, meta, fs, task = imported(mbart, tmp_path)
    assert meta["imported_from"]["model_type"] == "mbart"
    rows = [tok(s)["input_ids"] for s in lines[:24]]
    ref = [hf_generate(model, tok, lang, [r])[0] for r in rows]
    assert len({tuple(r) for r in ref}) > 16 and any(len(r) <= L for r in ref) and any(len(r) > L for r in ref)
    assert hf_generate(model, tok, lang, rows[:8]) == ref[:8]  # transformers' batch of 8 agrees with its batch 1
    for mode, opts in MODES.items():
        gen = task.build_generator([fs], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0, **opts))
        for bsz in (1, 8):
            got = []
            for i in range(0, len(rows), bsz):
                sample = make_sample(rows[i: i + bsz], task.target_dictionary.pad())
                got += [h[0]["tokens"].tolist() for h in task.inference_step(gen, [fs], sample)]
            assert got == ref, (mode, bsz)


def test_text_through_the_translator_is_transformers(mbart, tmp_path):
    """Sentences through Translator (static and streamed): transformers'
    tokenizer ids (the language token where its tokenizer puts it) and its
    decoded greedy outputs."""
    from fairseq_aggressive.translator import Translator

    hf, model, tok, lang, lines = mbart
    out, *_ = imported(mbart, tmp_path)
    want = [tok.decode(o, skip_special_tokens=True)
            for o in hf_generate(model, tok, lang, [tok(s)["input_ids"] for s in lines])]
    for settings in (dict(decoding="iad", engine="native", max_len_a=0, max_len_b=L),
                     dict(max_len_a=0, max_len_b=L)):  # (fairseq's own greedy)
        t = Translator.from_pretrained(str(out), **settings)
        assert [t.translate(s) for s in lines] == want, settings
        if "decoding" in settings:  # streamed through the engine's running batch (its source ids too)
            run = t.running_decoder()
            assert run is not None and [run.ids(s) for s in lines] == [tok(s)["input_ids"] for s in lines]
            assert t.translate_batch(lines, rows=8) == want
    assert len(set(want)) > 10


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_int8_generate_and_the_bench(mbart, tmp_path):
    """int8 on the engine (IAD) is the int8 model's own greedy; text binarized
    as SentencePiece pieces (the language token where the tokenizer puts it,
    --source-suffix given to fairseq's tools for cc25's) decodes in the bench as
    fairseq's greedy does, and for mBART-50's as CTranslate2's conversion of the
    same checkpoint (its target prefix the language token)."""
    import json
    import subprocess

    import sentencepiece as spm
    from helpers import run, tool

    hf, model, tok, lang, lines = mbart
    out, meta, fs, task = imported(mbart, tmp_path)
    rows = [tok(s)["input_ids"] for s in lines[:16]]
    outs = {}
    for name, opts in (("torch", dict(engine="torch")), ("engine IAD", dict(engine="native", decoding="iad"))):
        fs8, task8 = imported(mbart, tmp_path / name.replace(" ", "-"))[2:]
        gen = task8.build_generator([fs8], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0,
                                                              inference_precision="int8", **opts))
        sample = make_sample(rows, task8.target_dictionary.pad())
        outs[name] = [h[0]["tokens"].tolist() for h in task8.inference_step(gen, [fs8], sample)]
    assert outs["engine IAD"] == outs["torch"]
    cc25 = "decoding from" in meta["imported_from"]["token_ids"]
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    data = tmp_path / "data"
    data.mkdir()
    first = "" if cc25 else "en_XX "
    for side in ("en_XX", "de_DE"):
        (data / f"test.{side}").write_text("".join(first + " ".join(sp.encode(s, out_type=str)) + "\n" for s in lines))
    subprocess.run([tool("fairseq-preprocess"), "-s", "en_XX", "-t", "de_DE", "--testpref", str(data / "test"),
                    "--srcdict", str(out / "dict.en_XX.txt"), "--tgtdict", str(out / "dict.de_DE.txt"),
                    "--destdir", str(data / "bin"), "--workers", "1"], check=True, capture_output=True)
    js = tmp_path / "b.json"
    modes = "greedy,iad,ct2"
    run([tool("fairseq-aggressive-bench"), str(data / "bin"), "--path", str(out / "model.pt"),
         "--user-dir", "fairseq_aggressive", "--task", "aggressive_translation", "-s", "en_XX", "-t", "de_DE",
         "--gen-subset", "test", "--max-len-a", "0", "--max-len-b", str(L), "--min-len", "0", "--warmup", "2",
         "--threads", "1", "--batch-size", "4", "--bench-modes", modes, "--bench-json", str(js)]
        + (["--source-suffix", "en_XX"] if cc25 else []))
    res = json.loads(js.read_text())
    assert res["modes"]["iad"]["identical_to_greedy"] == len(lines)
    want = hf_generate(model, tok, lang, [tok(s)["input_ids"] for s in lines])
    assert [r["greedy"]["tokens"] for r in res["per_sentence"]] == want  # (binarized sources as the tokenizer's)
    assert res["modes"]["ct2"]["identical_to_greedy"] >= len(lines) - 1  # (other kernels: a near tie may flip one)
