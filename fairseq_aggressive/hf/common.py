"""What every converted architecture shares: the error, the parts a
conversion hands over, the weights fairseq names as transformers does."""
import argparse
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import torch


class ConversionError(ValueError):
    """The checkpoint cannot be converted exactly (the message says why)."""


@dataclass
class Conversion:
    """One checkpoint converted: the dictionary's entries after ``<s> <pad>
    </s> <unk>`` (index 4 on), the fairseq state dict, the ``hf_transformer``
    options beyond the shapes (``--final-logits-bias``, ...), files for the
    model directory (its name there -> a path to copy, or the bytes to
    write), the subword settings of its text (``--bpe hf_sentencepiece`` or
    ``hf_gpt2`` with their options, files by their names in the directory:
    bpe.py; None: none) and how token ids map."""

    words: List[str]
    state: Dict[str, torch.Tensor]
    flags: List[str]
    files: Dict[str, Union[str, bytes]] = field(default_factory=dict)
    text: Optional[dict] = None
    token_ids: str = "converted = transformers"


def transformers_module():
    try:
        import transformers
    except ImportError as e:
        raise ConversionError("importing Hugging Face checkpoints needs transformers and sentencepiece: "
                              "pip install 'fairseq-aggressive[hf]'") from e
    return transformers


def check_shapes(cfg) -> List[str]:
    """What the fairseq architecture cannot hold (a list of problems)."""
    problems = []
    if cfg.encoder_attention_heads != cfg.decoder_attention_heads or cfg.encoder_ffn_dim != cfg.decoder_ffn_dim:
        problems.append("encoder and decoder with different head counts or FFN sizes")
    if not getattr(cfg, "tie_word_embeddings", True):
        problems.append("an output projection apart from the embeddings (tie_word_embeddings false)")
    return problems


def check_fairseq_ids(cfg, what: str, problems: List[str], decoder_start: bool = True) -> None:
    """Raises a ConversionError naming ``problems`` and, for a model that came
    from fairseq, special ids other than fairseq's (bos 0, pad 1, eos 2; with
    ``decoder_start``, decoding from EOS); relu or gelu layers."""
    if cfg.activation_function not in ("relu", "gelu"):
        problems.append(f"activation {cfg.activation_function!r} (relu and gelu convert)")
    names = ["bos", "pad", "eos"] + (["decoder start"] if decoder_start else [])
    ids = [cfg.bos_token_id, cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id][: len(names)]
    if ids != [0, 1, 2, 2][: len(ids)]:
        problems.append("special ids " + ", ".join(f"{n} {i}" for n, i in zip(names, ids))
                        + " (fairseq's: bos 0, pad 1, eos 2" + (", decoding from EOS)" if decoder_start else ")"))
    if problems:
        raise ConversionError(f"this {what} checkpoint cannot be converted exactly: " + "; ".join(problems))


def generation_config(transformers, hf_dir: str, cfg):
    """The checkpoint's generation config (generation_config.json, else the model config's)."""
    try:
        return transformers.GenerationConfig.from_pretrained(hf_dir, local_files_only=True)
    except OSError:  # no generation_config.json
        return transformers.GenerationConfig.from_model_config(cfg)


def layer_weights(hf: Dict[str, torch.Tensor], emb: torch.Tensor, positions: Dict[str, torch.Tensor],
                  bias: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """The fairseq state dict: the shared embeddings ``emb`` (also the output
    projection, with ``bias``), each side's learned position table, and every
    other weight of transformers' ``model.encoder.*`` and ``model.decoder.*``
    (layers, layer norms), which fairseq names alike."""
    out = {}
    for side in ("encoder", "decoder"):
        out[f"{side}.embed_tokens.weight"] = emb
        out[f"{side}.embed_positions.weight"] = positions[side]
        out[f"{side}.version"] = torch.Tensor([3])  # (as fairseq saves its encoders and decoders)
        prefix = f"model.{side}."
        for k, v in hf.items():
            if k.startswith(prefix) and not k[len(prefix):].startswith(("embed_tokens.", "embed_positions.")):
                out[k[len("model."):]] = v
    out["decoder.output_projection.weight"] = emb
    if bias is not None:
        out["decoder.output_projection.bias"] = bias
    return out


def model_args(cfg, flags: List[str], data: str, source_lang: str, target_lang: str) -> argparse.Namespace:
    """The fairseq configuration (task and model) of the converted checkpoint."""
    from fairseq import options

    act = cfg.activation_function
    argv = [data, "--user-dir", os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            "--task", "aggressive_translation", "-s", source_lang, "-t", target_lang,
            "--arch", "hf_transformer", "--share-all-embeddings",
            "--encoder-embed-dim", str(cfg.d_model), "--decoder-embed-dim", str(cfg.d_model),
            "--encoder-ffn-embed-dim", str(cfg.encoder_ffn_dim),
            "--decoder-ffn-embed-dim", str(cfg.decoder_ffn_dim),
            "--encoder-layers", str(cfg.encoder_layers), "--decoder-layers", str(cfg.decoder_layers),
            "--encoder-attention-heads", str(cfg.encoder_attention_heads),
            "--decoder-attention-heads", str(cfg.decoder_attention_heads),
            "--activation-fn", "relu" if act in ("swish", "silu") else act,
            "--encoder-learned-pos", "--decoder-learned-pos",
            "--max-source-positions", str(cfg.max_position_embeddings),
            "--max-target-positions", str(cfg.max_position_embeddings),
            "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"] + flags
    if not getattr(cfg, "scale_embedding", False):
        argv.append("--no-scale-embedding")
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)
