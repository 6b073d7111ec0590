"""mBART checkpoints imported (fairseq_aggressive.hf): small random models
shaped like mbart-large-cc25 (pre-norm, gelu, scaled embeddings, a layer norm
on the embeddings and a final one on each side, final_logits_bias), with a
SentencePiece unigram model trained here under both of transformers' mBART
tokenizers: cc25's (the source language after EOS, decoding from the target
language's token) and mBART-50's (the source language first, the target's
forced first).  Greedy decoding through fairseq's own generator, the native
engine, its running batch and IAD gives transformers' own generate(num_beams=1)
token ids and text on every sentence, at batch 1 and 8."""
import pytest
import torch

from helpers import fast_first
from hf_helpers import MODES, bench, check_modes, check_translator, hf_ids, imported, int8_ids, sample_lines, vary

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
pytest.importorskip("google.protobuf", reason="transformers reads a SentencePiece model with protobuf")

TOKENIZERS = ["MBartTokenizer", "MBart50Tokenizer"]
PAIR = ("en_XX", "de_DE")


@pytest.fixture(scope="module", params=fast_first(TOKENIZERS))
def mbart(request, tmp_path_factory):
    """(HF directory, transformers model, tokenizer, generate()'s language arguments, held-out lines)."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("mbart")
    lines = sample_lines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines[:-40]), model_prefix=str(tmp / "sp"),
                                   vocab_size=300, model_type="unigram", minloglevel=2)  # (as mBART's)
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "sentencepiece.bpe.model").write_bytes((tmp / "sp.model").read_bytes())
    getattr(transformers, request.param).from_pretrained(str(hf), bos_token="<s>").save_pretrained(str(hf))
    tok = transformers.AutoTokenizer.from_pretrained(str(hf), src_lang=PAIR[0], tgt_lang=PAIR[1])
    assert type(tok).__name__ == request.param
    de = tok.convert_tokens_to_ids(PAIR[1])
    lang = dict(decoder_start_token_id=de) if request.param == "MBartTokenizer" else dict(forced_bos_token_id=de)
    cfg = transformers.MBartConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=128, activation_function="gelu",
                                   scale_embedding=True, init_std=1.0, decoder_start_token_id=2,  # (mBART-50's)
                                   normalize_before=True, add_final_layer_norm=True,  # (mbart-large-cc25's config.json)
                                   tokenizer_class=request.param)
    torch.manual_seed(0)
    model = transformers.MBartForConditionalGeneration(cfg).eval()
    vary(model, 0.1, eos_bias={"MBartTokenizer": 3.5, "MBart50Tokenizer": 2.5}[request.param])
    model.save_pretrained(hf)
    return hf, model, tok, dict(lang, forced_eos_token_id=2), lines[-40:]


def test_converted_mbart_decodes_as_transformers(mbart, tmp_path):
    hf, model, tok, lang, lines = mbart
    meta, fs, task = imported(hf, tmp_path / "out", *PAIR)
    assert meta["imported_from"]["model_type"] == "mbart"
    rows = [tok(s)["input_ids"] for s in lines[:24]]
    ref = [h for i in range(0, len(rows), 8) for h in hf_ids(model, rows[i : i + 8], 1, 2, **lang)]  # batches of 8
    assert len({tuple(r) for r in ref}) > 16 and any(len(r) <= 24 for r in ref) and any(len(r) > 24 for r in ref)
    assert [hf_ids(model, [r], 1, 2, **lang)[0] for r in rows[:8]] == ref[:8]  # transformers' batch 1 agrees with 8
    check_modes(task, fs, rows, ref, MODES)


def test_text_through_the_translator_is_transformers(mbart, tmp_path):
    """Sentences through Translator (static and streamed): transformers'
    tokenizer ids (the language token where its tokenizer puts it) and its
    decoded greedy outputs."""
    hf, model, tok, lang, lines = mbart
    imported(hf, tmp_path / "out", *PAIR)
    rows = [tok(s)["input_ids"] for s in lines]
    want = [tok.decode(o, skip_special_tokens=True) for o in hf_ids(model, rows, 1, 2, **lang)]
    t = check_translator(tmp_path / "out", lines, want)
    assert [t.encode(s).tolist() for s in lines] == rows
    assert [t.running_decoder().ids(s) for s in lines] == rows  # (the streamed sources too)
    assert len(set(want)) > 10


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_int8_and_the_bench_beside_ctranslate2(mbart, tmp_path):
    """int8 on the engine (IAD) is the int8 model's own greedy; text binarized
    as SentencePiece pieces (the language token where the tokenizer puts it:
    for cc25's, --source-suffix given to fairseq's tools) decodes in the bench
    as transformers, fairseq's greedy and CTranslate2's conversion of the same
    checkpoint do (its target prefix the language token: for cc25's, its start token)."""
    pytest.importorskip("ctranslate2")
    import sentencepiece as spm

    hf, model, tok, lang, lines = mbart
    rows = [tok(s)["input_ids"] for s in lines]
    outs = int8_ids(hf, tmp_path, rows[:16], source_lang=PAIR[0], target_lang=PAIR[1])
    assert outs["engine IAD"] == outs["torch"]
    out = tmp_path / "out"
    meta = imported(hf, out, *PAIR)[0]
    cc25 = "source_prefix" not in meta["text"]
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    first = "" if cc25 else PAIR[0] + " "
    res = bench(out, tmp_path, lines, lambda s: first + " ".join(sp.encode(s, out_type=str)), *PAIR,
                extra=["--source-suffix", PAIR[0]] if cc25 else [])
    assert [r["greedy"]["tokens"] for r in res["per_sentence"]] == hf_ids(model, rows, 1, 2, **lang)
