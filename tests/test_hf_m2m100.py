"""M2M100 checkpoints imported (fairseq_aggressive.hf): small random models
shaped like nllb-200-distilled-600M (pre-norm, relu, scaled embeddings, a
shared vocabulary with language codes, sources starting with their language
token, outputs forced to start with the target language's), with a
SentencePiece BPE model trained here.  Greedy decoding through fairseq's own
generator, the native engine, its running batch and IAD gives transformers'
own generate(num_beams=1, forced_bos_token_id=...) token ids and text on
every sentence, at batch 1 and 8."""
import argparse
import os

import pytest
import torch

from helpers import make_sample
from hf_helpers import L, MODES, bench, check_modes, check_translator, hf_ids, imported, int8_ids, sample_lines, vary

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
pytest.importorskip("google.protobuf", reason="transformers reads a SentencePiece model with protobuf")

LANGS = ["eng_Latn", "deu_Latn", "fra_Latn"]


@pytest.fixture(scope="module")
def nllb(tmp_path_factory):
    """(HF directory, transformers model, tokenizer, held-out English lines)."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("nllb")
    lines = sample_lines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines[:-40]), model_prefix=str(tmp / "sp"),
                                   vocab_size=300, model_type="bpe", minloglevel=2)
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "sentencepiece.bpe.model").write_bytes((tmp / "sp.model").read_bytes())
    tok = transformers.NllbTokenizer.from_pretrained(str(hf))
    tok.add_tokens(LANGS, special_tokens=True)  # (NLLB's tokenizer.json lists its 202 codes so)
    tok.save_pretrained(str(hf))
    V = len(tok)
    cfg = transformers.M2M100Config(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_position_embeddings=128, activation_function="relu",
                                    scale_embedding=True, init_std=1.0, decoder_start_token_id=2,
                                    forced_eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.M2M100ForConditionalGeneration(cfg).eval()
    vary(model, 0.1)
    model.save_pretrained(hf)
    return hf, model, transformers.AutoTokenizer.from_pretrained(str(hf), src_lang="eng_Latn"), lines[-40:]


def hf_greedy(model, tok, rows, tgt="deu_Latn"):
    """transformers' greedy token ids per sentence, the target language forced first."""
    return hf_ids(model, rows, 1, 2, forced_bos_token_id=tok.convert_tokens_to_ids(tgt), forced_eos_token_id=2)


def test_converted_nllb_decodes_as_transformers(nllb, tmp_path):
    hf, model, tok, lines = nllb
    meta, fs, task = imported(hf, tmp_path / "out", "eng_Latn", "deu_Latn")
    assert meta["imported_from"]["model_type"] == "m2m_100" and meta["text"]["source_prefix"] == "eng_Latn"
    rows = [tok(s)["input_ids"] for s in lines[:24]]
    ref = [h for i in range(0, len(rows), 8) for h in hf_greedy(model, tok, rows[i : i + 8])]  # in batches of 8
    de = tok.convert_tokens_to_ids("deu_Latn")
    assert all(r[0] == de for r in ref) and len({tuple(r) for r in ref}) > 16
    assert any(len(r) <= L for r in ref) and any(len(r) > L for r in ref)
    assert [hf_greedy(model, tok, [r])[0] for r in rows[:8]] == ref[:8]  # transformers' batch 1 agrees with its 8
    check_modes(task, fs, rows, ref, dict(MODES, **{"engine beam 1": dict(engine="native")}))


@pytest.mark.slow  # (the fast tier reads text through Marian's tokenizer: test_hf_import)
def test_text_through_the_translator_is_transformers(nllb, tmp_path):
    """Sentences through Translator (static and streamed): transformers'
    tokenizer ids (the source language token first) and its decoded greedy
    outputs (the forced target language token left out)."""
    hf, model, tok, lines = nllb
    imported(hf, tmp_path / "out", "eng_Latn", "fra_Latn")
    rows = [tok(s)["input_ids"] for s in lines]
    want = [tok.decode(o, skip_special_tokens=True) for o in hf_greedy(model, tok, rows, "fra_Latn")]
    t = check_translator(tmp_path / "out", lines, want)
    assert [t.encode(s).tolist() for s in lines] == rows
    assert len(set(want)) > 10


def test_refused_and_nothing_written(nllb, tmp_path):
    from fairseq_aggressive.hf import ConversionError, import_hf

    with pytest.raises(ConversionError, match="translates the pair named by --source-lang"):
        import_hf(str(nllb[0]), str(tmp_path / "out"))
    with pytest.raises(ConversionError, match="target language 'xx_Latn'"):
        import_hf(str(nllb[0]), str(tmp_path / "out"), "eng_Latn", "xx_Latn")
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".import")]


def test_drafters_and_int8_keep_the_forced_first_token(nllb, tmp_path):
    """A --feature-ar drafter (random, one layer) and GAD++'s acceptance rule on
    the engine and in torch, and the running batch, keep transformers' output;
    int8 on the engine is the int8 model's own greedy (fairseq's generator, its
    prefix token); beam search on the engine (fairseq's own for a forced first
    token) is fairseq's beam search, every hypothesis starting with the token."""
    from fairseq_aggressive.acceptance import RankAcceptance
    from fairseq_aggressive.drafters import FeatureARDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.models.hf_transformer import forced_first
    from fairseq_aggressive.streaming import RunningDecoder
    from helpers import make_model

    hf, model, tok, lines = nllb
    out = tmp_path / "out"
    _, fs, task = imported(hf, out, "eng_Latn", "deu_Latn")
    d = task.target_dictionary
    rows = [tok(s)["input_ids"] for s in lines[:16]]
    ref = hf_greedy(model, tok, rows[:8]) + hf_greedy(model, tok, rows[8:])  # (batches of 8 give batch 1's: above)
    de = forced_first(fs)
    assert de == tok.convert_tokens_to_ids("deu_Latn")
    dr = make_model(task, arch="block_nat", seed=5, shared_encoder=True, init_encoder_from=str(out / "model.pt"),
                    verifier_features=True, feature_ar=True, decoder_layers=1, block_causal_prefix=True,
                    encoder_learned_pos=True, max_source_positions=128, share_all_embeddings=True,
                    encoder_normalize_before=True)
    for engine in ("native", "torch"):
        gen = build_generator([fs], d, FeatureARDrafter(dr, d, 4, engine=engine), engine=engine, max_len_a=0,
                              max_len_b=L, min_len=0, forced_first=de)
        got = [h[0]["tokens"].tolist() for i in range(0, 16, 8)
               for h in gen.generate([fs], make_sample(rows[i: i + 8], d.pad()))]
        assert got == ref, engine
        assert gen.stats.drafted > 0
        if engine == "native":
            run = RunningDecoder.of_generator(gen)
            assert run is not None and run.run["forced"] == de
    for engine in ("native", "torch"):  # GAD++'s rule accepts near-top drafts, never another first token
        gpp = build_generator([fs], d, FeatureARDrafter(dr, d, 4, engine=engine), RankAcceptance(3, 100.0),
                              engine=engine, max_len_a=0, max_len_b=L, min_len=0, forced_first=de)
        got = [h[0]["tokens"].tolist() for h in gpp.generate([fs], make_sample(rows, d.pad()))]
        assert all(o[0] == de for o in got) and got != ref and gpp.stats.accepted > 0, engine
    outs = int8_ids(hf, tmp_path, rows, source_lang="eng_Latn", target_lang="deu_Latn")
    assert outs["engine IAD"] == outs["torch"] and all(o[0] == de for o in outs["torch"])
    beams = {}
    for engine in ("torch", "native"):
        gen = task.build_generator([fs], argparse.Namespace(beam=5, max_len_a=0, max_len_b=L, min_len=0,
                                                            engine=engine))
        beams[engine] = [h[0]["tokens"].tolist() for h in task.inference_step(gen, [fs], make_sample(rows, d.pad()))]
    assert beams["native"] == beams["torch"] and all(b[0] == de for b in beams["torch"])


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_generate_and_the_bench_beside_ctranslate2(nllb, tmp_path):
    """Text binarized with the source language token first (as docs/hugging-face.md
    says), decoded by the bench: fairseq's greedy, the engine's greedy and IAD, and
    CTranslate2's conversion of the same transformers checkpoint (its target
    prefix the forced token) give the same outputs, transformers'."""
    pytest.importorskip("ctranslate2")
    import sentencepiece as spm

    hf, model, tok, lines = nllb
    out = tmp_path / "out"
    imported(hf, out, "eng_Latn", "deu_Latn")
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    res = bench(out, tmp_path, lines, lambda s: "eng_Latn " + " ".join(sp.encode(s, out_type=str)),
                "eng_Latn", "deu_Latn", modes="greedy,greedy-native,iad,ct2")
    assert [r["greedy"]["tokens"] for r in res["per_sentence"]] == hf_greedy(model, tok, [tok(s)["input_ids"]
                                                                                          for s in lines])
