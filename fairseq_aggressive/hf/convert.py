"""A local Hugging Face checkpoint directory (config.json, weights, tokenizer
files) converted into a model directory of this package: a fairseq
checkpoint of the ``hf_transformer`` architecture, its dictionaries and its
SentencePiece models, which ``Translator.from_pretrained``, the server,
``fairseq-generate --user-dir fairseq_aggressive`` and the bench take.

Marian (OPUS-MT) checkpoints.  Token ids: fairseq keeps ``<s> <pad> </s>
<unk>`` at 0..3 and pads with ``<pad>`` (masked as a key, no position);
Marian has ``</s>`` at 0, ``<unk>`` at 1 and its pad token last, which is
also the token its decoder starts from.  So the converted model's id of a
Marian token is its Marian id + 2; Marian's pad becomes ``<s>``, the token
decoding starts from (``--decoder-start bos``), with its embedding; the
dictionary's ``<pad>`` is a new row of zeros.  Neither is ever emitted: both
get -inf in the output bias (transformers' OPUS-MT configs forbid the pad
token with ``bad_words_ids``).  Positions are baked as learned positions with
transformers' own sinusoid table.  :func:`to_hf_ids` and :func:`from_hf_ids`
map ids between the two.

Anything the conversion cannot reproduce exactly is refused with a
:class:`ConversionError` that names it; nothing is written then.
"""
import argparse
import json
import os
import shutil
import tempfile
from typing import Dict, List, Sequence

import torch

SUPPORTED = ("marian",)
SHIFT = 2  # a Marian id's offset in the converted dictionary


class ConversionError(ValueError):
    """The checkpoint cannot be converted exactly (the message says why)."""


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ConversionError("importing Hugging Face checkpoints needs transformers and sentencepiece: "
                              "pip install 'fairseq-aggressive[hf]'") from e
    return transformers


def to_hf_ids(ids: Sequence[int]) -> List[int]:
    """Converted-model ids of a Marian model's tokens -> its transformers ids."""
    return [i - SHIFT for i in ids]


def from_hf_ids(ids: Sequence[int]) -> List[int]:
    """transformers ids of a Marian model's tokens -> the converted model's ids."""
    return [i + SHIFT for i in ids]


def _check_marian(cfg) -> None:
    problems = []
    act = getattr(cfg, "activation_function", "relu")
    if act not in ("relu", "gelu", "swish", "silu"):
        problems.append(f"activation {act!r} (relu, gelu and swish convert)")
    if not getattr(cfg, "share_encoder_decoder_embeddings", True):
        problems.append("separate source and target vocabularies (share_encoder_decoder_embeddings false)")
    if getattr(cfg, "decoder_vocab_size", cfg.vocab_size) not in (None, cfg.vocab_size):
        problems.append("a decoder vocabulary of another size")
    if not getattr(cfg, "tie_word_embeddings", True):
        problems.append("an output projection apart from the embeddings (tie_word_embeddings false)")
    if getattr(cfg, "normalize_before", False):
        problems.append("pre-norm layers")
    pad, eos, start = cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id
    if pad != cfg.vocab_size - 1 or eos != 0 or start != pad:
        problems.append(f"special ids pad {pad}, eos {eos}, decoder start {start} "
                        "(Marian's: pad last, eos 0, decoding from pad)")
    if cfg.encoder_attention_heads != cfg.decoder_attention_heads or cfg.encoder_ffn_dim != cfg.decoder_ffn_dim:
        problems.append("encoder and decoder with different head counts or FFN sizes")
    if problems:
        raise ConversionError("this Marian checkpoint cannot be converted exactly: " + "; ".join(problems))


def _check_pad_forbidden(transformers, hf_dir: str, cfg) -> None:
    """The converted model never emits Marian's pad token (it is the start
    token there): transformers' generation must forbid it too, as OPUS-MT's
    generation configs do (bad_words_ids)."""
    try:
        gen = transformers.GenerationConfig.from_pretrained(hf_dir, local_files_only=True)
    except OSError:  # no generation_config.json: the model config's
        gen = transformers.GenerationConfig.from_model_config(cfg)
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
    out = {}
    for side in ("encoder", "decoder"):
        out[f"{side}.embed_tokens.weight"] = emb
        table = model.get_encoder().embed_positions.weight if side == "encoder" else \
            model.get_decoder().embed_positions.weight
        pos = torch.zeros(table.size(0) + SHIFT, C)
        pos[SHIFT:] = table.detach().float()  # fairseq's learned positions start after the pad index (1)
        out[f"{side}.embed_positions.weight"] = pos
        out[f"{side}.version"] = torch.Tensor([3])  # (as fairseq saves its encoders and decoders)
    prefix = "model."
    for k, v in hf.items():
        if k.startswith(prefix + "encoder.layers.") or k.startswith(prefix + "decoder.layers."):
            out[k[len(prefix):]] = v
    out["decoder.output_projection.weight"] = emb
    out["decoder.output_projection.bias"] = bias
    return out


def _model_args(cfg, data: str, source_lang: str, target_lang: str) -> argparse.Namespace:
    """The fairseq configuration (task and model) of the converted checkpoint."""
    from fairseq import options

    swish = cfg.activation_function in ("swish", "silu")
    argv = [data, "--user-dir", os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            "--task", "aggressive_translation", "-s", source_lang, "-t", target_lang,
            "--arch", "hf_transformer", "--share-all-embeddings",
            "--encoder-embed-dim", str(cfg.d_model), "--decoder-embed-dim", str(cfg.d_model),
            "--encoder-ffn-embed-dim", str(cfg.encoder_ffn_dim),
            "--decoder-ffn-embed-dim", str(cfg.decoder_ffn_dim),
            "--encoder-layers", str(cfg.encoder_layers), "--decoder-layers", str(cfg.decoder_layers),
            "--encoder-attention-heads", str(cfg.encoder_attention_heads),
            "--decoder-attention-heads", str(cfg.decoder_attention_heads),
            "--activation-fn", "relu" if swish else cfg.activation_function,
            "--encoder-learned-pos", "--decoder-learned-pos",
            "--max-source-positions", str(cfg.max_position_embeddings),
            "--max-target-positions", str(cfg.max_position_embeddings),
            "--final-logits-bias", "--decoder-start", "bos", "--dropout", "0", "--attention-dropout", "0",
            "--activation-dropout", "0"]
    if swish:
        argv.append("--swish")
    if not getattr(cfg, "scale_embedding", False):
        argv.append("--no-scale-embedding")
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)


def import_hf(hf_dir: str, out_dir: str, source_lang: str = "src", target_lang: str = "tgt") -> dict:
    """Converts the transformers checkpoint in ``hf_dir`` into the model
    directory ``out_dir`` (made whole or not at all); returns what its
    MODEL.json says."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    transformers = _transformers()
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise ConversionError(f"{hf_dir}: no config.json (a transformers checkpoint directory)")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ConversionError(f"{out_dir} exists and is not empty")
    cfg = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    if cfg.model_type not in SUPPORTED:
        raise ConversionError(f"model type {cfg.model_type!r}: this converter takes {', '.join(SUPPORTED)}")
    _check_marian(cfg)
    _check_pad_forbidden(transformers, hf_dir, cfg)
    words = _vocab(hf_dir, cfg.vocab_size)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir, local_files_only=True,
                                                               dtype=torch.float32).eval()
    state = _marian_state(model, cfg)
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".import-", dir=parent)
    try:
        for lang in (source_lang, target_lang):
            with open(os.path.join(work, f"dict.{lang}.txt"), "w", encoding="utf-8") as f:
                f.writelines(f"{w} 1\n" for w in words[2:-1])
        args = _model_args(cfg, work, source_lang, target_lang)
        ckpt = {"args": None, "cfg": convert_namespace_to_omegaconf(args), "model": state,
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "extra_state": {}, "last_optimizer_state": {}}
        ckpt["cfg"]["task"]["data"] = "."  # the directory it is loaded from
        ckpt["cfg"]["generation"]["min_len"] = 0  # transformers' generate may end a sentence at once
        torch.save(ckpt, os.path.join(work, "model.pt"))
        for name in ("source.spm", "target.spm"):
            if os.path.isfile(os.path.join(hf_dir, name)):
                shutil.copyfile(os.path.join(hf_dir, name), os.path.join(work, name))
        meta = {"arch": "hf_transformer", "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
                "embed_dim": cfg.d_model, "ffn_dim": cfg.encoder_ffn_dim, "source_lang": source_lang,
                "target_lang": target_lang, "parameters": sum(p.numel() for p in model.parameters()),
                "imported_from": {"model_type": cfg.model_type, "path": os.path.abspath(hf_dir),
                                  "token_ids": f"converted = transformers + {SHIFT}; transformers' pad = <s>"},
                "storage": "float32"}
        with open(os.path.join(work, "MODEL.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # (empty)
        os.rename(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return meta
