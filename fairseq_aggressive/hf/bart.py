"""BART checkpoints (``model_type`` bart).

Token ids are transformers' own: BART comes from fairseq, whose dictionary
keeps ``<s> <pad> </s> <unk>`` at 0..3.  Text goes through fairseq's GPT-2
byte-level BPE over the tokenizer's ``vocab.json`` and ``merges.txt``
(``--bpe hf_gpt2``), whose pieces are the tokenizer's ids; so the dictionary
lists each id by its number (``<mask>`` by name).  Layers are post-norm with a
layer norm on the embeddings (``--layernorm-embedding``), the output has
``final_logits_bias``, and positions are transformers' learned table, whose
first row is the pad index + 1 as in fairseq.  Sources start with ``<s>``
(``--source-prefix``); where the generation config forces a first token
(``forced_bos_token_id``: ``<s>`` for bart-large), so does the converted model
(``--forced-first``).  Decoding starts from EOS, as fairseq's does.
"""
import json
import os
from typing import Dict, List

from .common import Conversion, ConversionError, check_fairseq_ids, check_shapes, generation_config, layer_weights

SPECIAL = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}


def _check(cfg) -> None:
    problems = check_shapes(cfg)
    if getattr(cfg, "add_final_layer_norm", False) or getattr(cfg, "normalize_before", False):
        problems.append("pre-norm layers or a final layer norm (BART's are post-norm)")
    check_fairseq_ids(cfg, "BART", problems)


def _words(hf_dir: str, size: int) -> List[str]:
    """The dictionary's entries from index 4 on: each id's number (GPT-2 BPE's
    pieces), ``<mask>`` by name."""
    path = os.path.join(hf_dir, "vocab.json")
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(hf_dir, "merges.txt")):
        raise ConversionError(f"{hf_dir}: no vocab.json and merges.txt (BART's byte-level BPE)")
    with open(path, encoding="utf-8") as f:
        vocab: Dict[str, int] = json.load(f)
    by_id = {i: t for t, i in vocab.items()}
    if len(by_id) != len(vocab) or max(by_id) >= size:
        raise ConversionError(f"vocab.json: ids repeated or beyond the model's {size} embeddings")
    for t, i in SPECIAL.items():
        if by_id.get(i) != t:
            raise ConversionError(f"vocab.json: id {i} is {by_id.get(i)!r}, not fairseq's {t!r}")
    words = []
    for i in range(4, size):
        t = by_id.get(i)
        if t is None:
            words.append(f"madeupword{i:04d}")  # (embeddings past the tokenizer's)
        elif t == "<mask>":
            words.append(t)
        elif t in SPECIAL:
            raise ConversionError(f"vocab.json: {t!r} under a second id {i}")
        else:
            words.append(str(i))
    return words


def _merges(hf_dir: str) -> bytes:
    """merges.txt as fairseq's GPT-2 BPE reads it: a header line first, a newline last."""
    with open(os.path.join(hf_dir, "merges.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].startswith("#"):
        lines = ["#version: 0.2"] + lines
    return ("\n".join(lines) + "\n").encode("utf-8")


def convert(transformers, hf_dir: str, cfg, model) -> Conversion:
    """The converted parts of a transformers BartForConditionalGeneration."""
    _check(cfg)
    words = _words(hf_dir, cfg.vocab_size)
    hf = {k: v.detach().float() for k, v in model.state_dict().items()}
    tables = {side: part.embed_positions.weight.detach().float().clone()
              for side, part in (("encoder", model.get_encoder()), ("decoder", model.get_decoder()))}
    bias = hf["final_logits_bias"].reshape(-1) if "final_logits_bias" in hf else None
    state = layer_weights(hf, hf["model.shared.weight"], tables, bias)
    flags = ["--layernorm-embedding"] + (["--final-logits-bias"] if bias is not None else [])
    forced = generation_config(transformers, hf_dir, cfg).forced_bos_token_id
    if forced is not None:
        if not 0 <= forced < cfg.vocab_size:
            raise ConversionError(f"forced_bos_token_id {forced} is outside the vocabulary")
        flags += ["--forced-first", str(forced)]
    drop = ["<s>", "<unk>"] + (["<mask>"] if "<mask>" in words else [])
    return Conversion(words=words, state=state, flags=flags,
                      files={"bpe.vocab.json": os.path.join(hf_dir, "vocab.json"), "bpe.merges.txt": _merges(hf_dir)},
                      text={"bpe": "hf_gpt2", "gpt2_encoder_json": "bpe.vocab.json",
                            "gpt2_vocab_bpe": "bpe.merges.txt", "source_prefix": "<s>", "drop_symbols": ",".join(drop)},
                      token_ids="converted = transformers; sources start with <s>"
                      + ("" if forced is None else f", outputs with id {forced}"))
