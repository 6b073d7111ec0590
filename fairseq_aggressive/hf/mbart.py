"""mBART checkpoints (``model_type`` mbart): mbart-large-cc25 and the models
fine-tuned from it, and mBART-50's.

Token ids are transformers' own, as for M2M100 (:mod:`.m2m100`): the
dictionary lists the tokenizer's tokens by id, language codes and ``<mask>``
included.  Layers are pre-norm with a layer norm on the embeddings and a
final one on each side; the output has ``final_logits_bias``; positions are
transformers' learned table, whose first row is the pad index + 1 as in
fairseq.

A converted model translates one language pair.  Where the language token
goes is the tokenizer's, read from it at import:

- mbart-large-cc25's (``MBartTokenizer``): a source is its pieces, EOS and
  the source language's token (``--source-suffix``, after fairseq's EOS), and
  decoding starts from the target language's token (``--decoder-start``), as
  transformers' ``decoder_start_token_id`` for such a model;
- mBART-50's (``MBart50Tokenizer``): the source language's token first
  (``--source-prefix``), decoding from the model's decoder start token (EOS
  for mBART-50's models), and the target language's token forced first
  (``--forced-first``, ``forced_bos_token_id``).
"""
from typing import List, Tuple

from .common import Conversion, ConversionError, check_fairseq_ids, check_shapes, generation_config, layer_weights
from .m2m100 import language_token, special_symbols, spm_file, tokenizer, words_of

PROBE = "a b c"


def _check(cfg) -> None:
    check_fairseq_ids(cfg, "mBART", check_shapes(cfg), decoder_start=False)


def decoder_start_id(transformers, hf_dir: str, cfg) -> int:
    """The token transformers' ``generate`` starts decoding from: the generation
    config's ``decoder_start_token_id``, else the model config's, else BOS."""
    gen = generation_config(transformers, hf_dir, cfg)
    for start in (gen.decoder_start_token_id, cfg.decoder_start_token_id, cfg.bos_token_id):
        if start is not None:
            if not 0 <= start < cfg.vocab_size:
                raise ConversionError(f"decoder start token {start} is outside the vocabulary")
            return start
    raise ConversionError("no decoder start token (decoder_start_token_id, bos_token_id)")


def source_pattern(tok) -> Tuple[List[str], List[str]]:
    """The symbols the tokenizer puts before a source's pieces, and after its EOS."""
    full = tok(PROBE)["input_ids"]
    bare = tok(PROBE, add_special_tokens=False)["input_ids"]
    at = [k for k in range(len(full) - len(bare) + 1) if full[k: k + len(bare)] == bare]
    if not bare or not at or full[at[0] + len(bare): at[0] + len(bare) + 1] != [tok.eos_token_id]:
        raise ConversionError(f"the tokenizer's source {full} does not hold its pieces {bare} followed by </s>")
    k = at[0]
    return tok.convert_ids_to_tokens(full[:k]), tok.convert_ids_to_tokens(full[k + len(bare) + 1:])


def convert(transformers, hf_dir: str, cfg, model, source_lang: str, target_lang: str) -> Conversion:
    """The converted parts of a transformers MBartForConditionalGeneration."""
    _check(cfg)
    spm = spm_file(hf_dir)
    words = words_of(tokenizer(transformers, hf_dir), cfg.vocab_size)
    src, tgt = (language_token(words, code, side) for code, side in ((source_lang, "source"),
                                                                      (target_lang, "target")))
    tok = tokenizer(transformers, hf_dir, src_lang=src, tgt_lang=tgt)
    prefix, suffix = source_pattern(tok)
    if src not in prefix + suffix:
        raise ConversionError(f"the tokenizer does not mark a source with its language token {src!r} "
                              f"(before the pieces: {prefix}, after EOS: {suffix})")
    hf = {k: v.detach().float() for k, v in model.state_dict().items()}
    tables = {side: part.embed_positions.weight.detach().float().clone()
              for side, part in (("encoder", model.get_encoder()), ("decoder", model.get_decoder()))}
    bias = hf["final_logits_bias"].reshape(-1) if "final_logits_bias" in hf else None
    state = layer_weights(hf, hf["model.shared.weight"], tables, bias)
    index = words.index(tgt) + 4
    flags = ["--encoder-normalize-before", "--decoder-normalize-before", "--layernorm-embedding"]
    flags += ["--final-logits-bias"] if bias is not None else []
    # the language after the source's EOS: decoding starts from the target's (cc25); before the pieces: forced
    # first, decoding from the model's start token (transformers' rule: the generation config's, else <s>)
    if suffix:
        flags += ["--decoder-start", str(index), "--source-suffix", ",".join(suffix)]
    else:
        start = decoder_start_id(transformers, hf_dir, cfg)
        flags += ["--forced-first", str(index), "--decoder-start", {2: "eos", 0: "bos"}.get(start, str(start))]
    text = {"bpe": "hf_sentencepiece", "sentencepiece_model": "source.spm",
            "drop_symbols": ",".join(special_symbols(tok, words))}
    if prefix:
        text["source_prefix"] = ",".join(prefix)
    return Conversion(words=words, state=state, flags=flags, files={"source.spm": spm, "target.spm": spm},
                      text=text,
                      token_ids=f"converted = transformers; sources {' '.join(prefix)} ... </s> {' '.join(suffix)}, "
                      + ("decoding from " if suffix else "outputs starting with ") + tgt)
