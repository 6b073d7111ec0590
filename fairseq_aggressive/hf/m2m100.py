"""M2M100 checkpoints, NLLB's among them (``model_type`` m2m_100).

Token ids are transformers' own: these models come from fairseq, whose
dictionary keeps ``<s> <pad> </s> <unk>`` at 0..3, so the dictionary lists
the tokenizer's tokens from id 4 on (language codes and ``<mask>``
included).  Layers are pre-norm with a final layer norm on each side
(fairseq's ``--encoder-normalize-before``); positions are transformers'
sinusoid table, whose first row is the pad index + 1 as in fairseq, baked as
learned positions.

A converted model translates one language pair, named at import as
transformers' tokenizer names them (``eng_Latn``; M2M100's ``en`` is its
token ``__en__``): every source starts with the source language's token
(``--bpe hf_sentencepiece --source-prefix``), and every output with the
target language's (``--forced-first``, transformers' ``forced_bos_token_id``).
Decoding starts from EOS, as fairseq's does.
"""
import os
from typing import List

from .common import Conversion, ConversionError, check_fairseq_ids, check_shapes, layer_weights

SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
SPM_NAMES = ("sentencepiece.bpe.model", "spm.model", "sentencepiece.model")


def _check(cfg) -> None:
    check_fairseq_ids(cfg, "M2M100", check_shapes(cfg))


def tokenizer(transformers, hf_dir: str, **kwargs):
    """transformers' tokenizer of the checkpoint (a ConversionError where it cannot load)."""
    try:
        return transformers.AutoTokenizer.from_pretrained(hf_dir, local_files_only=True, **kwargs)
    except Exception as e:  # (transformers raises many kinds here)
        raise ConversionError(f"{hf_dir}: transformers cannot load its tokenizer ({type(e).__name__}: {e})") from e


def words_of(tok, size: int) -> List[str]:
    """The dictionary's entries from index 4 on: the tokenizer's tokens by id."""
    if len(tok) > size:
        raise ConversionError(f"the tokenizer has {len(tok)} tokens, the model {size} embeddings")
    first = tok.convert_ids_to_tokens(list(range(4)))
    if first != SPECIAL:
        raise ConversionError(f"the tokenizer's ids 0..3 are {first}, not fairseq's {SPECIAL}")
    words = []
    for i, w in enumerate(tok.convert_ids_to_tokens(list(range(4, size))), 4):
        w = w if w is not None and i < len(tok) else f"madeupword{i:04d}"  # (embeddings past the tokenizer's)
        if any(c.isspace() for c in w) or w in SPECIAL:
            raise ConversionError(f"the tokenizer's token {i} {w!r} cannot be a fairseq dictionary entry")
        words.append(w)
    if len(set(words)) != len(words):
        raise ConversionError("the tokenizer has a token under two ids")
    return words


def special_symbols(tok, words: List[str]) -> List[str]:
    """The symbols transformers' ``decode(skip_special_tokens=True)`` leaves out (but EOS and pad)."""
    special = list(tok.all_special_tokens) + [t.content for t in tok.added_tokens_decoder.values() if t.special]
    return sorted({t for t in special if t in words or t in ("<s>", "<unk>")} - {"</s>", "<pad>"})


def spm_file(hf_dir: str) -> str:
    """The checkpoint's SentencePiece model."""
    for name in SPM_NAMES:
        if os.path.isfile(os.path.join(hf_dir, name)):
            return os.path.join(hf_dir, name)
    raise ConversionError(f"{hf_dir}: no SentencePiece model ({', '.join(SPM_NAMES)})")


def language_token(words: List[str], code: str, side: str) -> str:
    """The dictionary symbol of language ``code`` (``eng_Latn``, or M2M100's ``__en__`` for ``en``)."""
    for token in (code, f"__{code}__"):
        if token in words:
            return token
    raise ConversionError(f"{side} language {code!r}: the tokenizer has no token {code!r} or '__{code}__' "
                          f"(--source-lang and --target-lang name the pair this model will translate, as "
                          f"transformers' tokenizer names them)")


def convert(transformers, hf_dir: str, cfg, model, source_lang: str, target_lang: str) -> Conversion:
    """The converted parts of a transformers M2M100ForConditionalGeneration."""
    _check(cfg)
    spm = spm_file(hf_dir)
    tok = tokenizer(transformers, hf_dir)
    words = words_of(tok, cfg.vocab_size)
    src, tgt = (language_token(words, code, side) for code, side in ((source_lang, "source"),
                                                                      (target_lang, "target")))
    hf = {k: v.detach().float() for k, v in model.state_dict().items()}
    tables = {side: part.embed_positions.weights.detach().float().clone()
              for side, part in (("encoder", model.get_encoder()), ("decoder", model.get_decoder()))}
    state = layer_weights(hf, hf["model.shared.weight"], tables)
    flags = ["--encoder-normalize-before", "--decoder-normalize-before",
             "--forced-first", str(words.index(tgt) + 4)]
    drop = special_symbols(tok, words)
    return Conversion(words=words, state=state, flags=flags,
                      files={"source.spm": spm, "target.spm": spm},
                      text={"bpe": "hf_sentencepiece", "sentencepiece_model": "source.spm", "source_prefix": src,
                            "drop_symbols": ",".join(drop)},
                      token_ids=f"converted = transformers; sources start with {src}, outputs with {tgt}")
