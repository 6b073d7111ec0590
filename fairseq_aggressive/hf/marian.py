"""Marian (OPUS-MT) checkpoints.

Token ids: fairseq keeps ``<s> <pad> </s> <unk>`` at 0..3 and pads with
``<pad>`` (masked as a key, no position); Marian has ``</s>`` at 0, ``<unk>``
at 1 and its pad token last, which is also the token its decoder starts
from.  So the converted model's id of a Marian token is its Marian id + 2;
Marian's pad becomes ``<s>``, the token decoding starts from
(``--decoder-start bos``), with its embedding; the dictionary's ``<pad>`` is
a new row of zeros.  Neither is ever emitted: both get -inf in the output
bias (transformers' OPUS-MT configs forbid the pad token with
``bad_words_ids``).  Positions are baked as learned positions with
transformers' own sinusoid table.  :func:`to_hf_ids` and :func:`from_hf_ids`
map ids between the two.
"""
import json
import os
from typing import Dict, List, Sequence

import torch

from .common import Conversion, ConversionError, check_shapes, generation_config, layer_weights

SHIFT = 2  # a Marian id's offset in the converted dictionary


def to_hf_ids(ids: Sequence[int]) -> List[int]:
    """Converted-model ids of a Marian model's tokens -> its transformers ids."""
    return [i - SHIFT for i in ids]


def from_hf_ids(ids: Sequence[int]) -> List[int]:
    """transformers ids of a Marian model's tokens -> the converted model's ids."""
    return [i + SHIFT for i in ids]


def _check_marian(cfg) -> None:
    problems = check_shapes(cfg)
    act = getattr(cfg, "activation_function", "relu")
    if act not in ("relu", "gelu", "swish", "silu"):
        problems.append(f"activation {act!r} (relu, gelu and swish convert)")
    if not getattr(cfg, "share_encoder_decoder_embeddings", True):
        problems.append("separate source and target vocabularies (share_encoder_decoder_embeddings false)")
    if getattr(cfg, "decoder_vocab_size", cfg.vocab_size) not in (None, cfg.vocab_size):
        problems.append("a decoder vocabulary of another size")
    if getattr(cfg, "normalize_before", False):
        problems.append("pre-norm layers")
    pad, eos, start = cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id
    if pad != cfg.vocab_size - 1 or eos != 0 or start != pad:
        problems.append(f"special ids pad {pad}, eos {eos}, decoder start {start} "
                        "(Marian's: pad last, eos 0, decoding from pad)")
    if problems:
        raise ConversionError("this Marian checkpoint cannot be converted exactly: " + "; ".join(problems))


def _check_pad_forbidden(transformers, hf_dir: str, cfg) -> None:
    """The converted model never emits Marian's pad token (it is the start
    token there): transformers' generation must forbid it too, as OPUS-MT's
    generation configs do (bad_words_ids)."""
    gen = generation_config(transformers, hf_dir, cfg)
    if [cfg.pad_token_id] not in (gen.bad_words_ids or []):
        raise ConversionError(f"transformers may emit its pad token {cfg.pad_token_id} with this checkpoint (no "
                              f"bad_words_ids [[{cfg.pad_token_id}]] in its generation config, as OPUS-MT's have); "
                              "the converted model never does")


def _vocab(hf_dir: str, size: int) -> List[str]:
    """The Marian vocabulary (vocab.json), by id."""
    path = os.path.join(hf_dir, "vocab.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{hf_dir}: no vocab.json (the Marian tokenizer's vocabulary)")
    with open(path, encoding="utf-8") as f:
        by_piece: Dict[str, int] = json.load(f)
    words = [None] * size
    for piece, i in by_piece.items():
        if not 0 <= i < size:
            raise ConversionError(f"vocab.json: {piece!r} has id {i}, outside the model's {size} embeddings")
        words[i] = piece
    missing = [i for i, w in enumerate(words) if w is None]
    if missing:
        raise ConversionError(f"vocab.json has no token for ids {missing[:5]} (the model has {size} embeddings)")
    for i, w in enumerate(words[2:-1], 2):
        if any(c.isspace() for c in w) or w in ("<s>", "<pad>", "</s>", "<unk>"):
            raise ConversionError(f"vocab.json: token {i} {w!r} cannot be a fairseq dictionary entry")
    return words


def _marian_state(model, cfg) -> Dict[str, torch.Tensor]:
    """The fairseq state dict of a transformers MarianMTModel."""
    hf = {k: v.detach().float() for k, v in model.state_dict().items()}
    V, C = cfg.vocab_size, cfg.d_model
    order = torch.tensor([V - 1, V - 1] + list(range(V - 1)))  # <s> = Marian's pad, <pad> (zeroed below), the rest
    emb = hf["model.shared.weight"][order].clone()
    emb[1].zero_()
    bias = hf.get("final_logits_bias", torch.zeros(1, V)).reshape(-1)[order].clone()
    bias[:2] = float("-inf")  # never emitted: the start token and padding
    tables = {}
    for side, part in (("encoder", model.get_encoder()), ("decoder", model.get_decoder())):
        pos = torch.zeros(part.embed_positions.weight.size(0) + SHIFT, C)
        pos[SHIFT:] = part.embed_positions.weight.detach().float()  # fairseq's start after the pad index (1)
        tables[side] = pos
    return layer_weights(hf, emb, tables, bias)


def convert(transformers, hf_dir: str, cfg, model) -> Conversion:
    """The converted parts of a transformers MarianMTModel."""
    _check_marian(cfg)
    _check_pad_forbidden(transformers, hf_dir, cfg)
    words = _vocab(hf_dir, cfg.vocab_size)
    flags = ["--final-logits-bias", "--decoder-start", "bos"]
    if cfg.activation_function in ("swish", "silu"):
        flags.append("--swish")
    spm = {name: os.path.join(hf_dir, name) for name in ("source.spm", "target.spm")
           if os.path.isfile(os.path.join(hf_dir, name))}
    return Conversion(words=words[2:-1], state=_marian_state(model, cfg), flags=flags, files=spm,
                      text={"bpe": "hf_sentencepiece", "sentencepiece_model": "source.spm",
                            "drop_symbols": "<unk>"} if spm else None,
                      token_ids=f"converted = transformers + {SHIFT}; transformers' pad = <s>")
