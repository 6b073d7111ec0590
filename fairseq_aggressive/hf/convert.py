"""A local Hugging Face checkpoint directory (config.json, weights, tokenizer
files) converted into a model directory of this package: a fairseq
checkpoint of the ``hf_transformer`` architecture, its dictionaries and its
SentencePiece models, which ``Translator.from_pretrained``, the server,
``fairseq-generate --user-dir fairseq_aggressive`` and the bench take.

Each architecture's conversion is a module of its own (:mod:`.marian`,
:mod:`.bart`, :mod:`.mbart`, :mod:`.m2m100`), which hands over a :class:`~.common.Conversion`; this module
writes it.  Anything a conversion cannot reproduce exactly is refused with a
:class:`ConversionError` that names it; nothing is written then.
"""
import json
import os
import shutil
import tempfile

import torch

from . import bart, m2m100, marian, mbart
from .common import ConversionError, model_args, transformers_module
from .marian import from_hf_ids, to_hf_ids

__all__ = ["ConversionError", "import_hf", "from_hf_ids", "to_hf_ids", "SUPPORTED"]

SUPPORTED = ("marian", "bart", "mbart", "m2m_100")


def import_hf(hf_dir: str, out_dir: str, source_lang: str = "src", target_lang: str = "tgt") -> dict:
    """Converts the transformers checkpoint in ``hf_dir`` into the model
    directory ``out_dir`` (made whole or not at all); returns what its
    MODEL.json says.  ``source_lang``, ``target_lang``: the languages' names
    in the dictionaries; for a multilingual model (mBART, M2M100, NLLB) the pair it
    will translate, as transformers' tokenizer names them (``eng_Latn``)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    transformers = transformers_module()
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise ConversionError(f"{hf_dir}: no config.json (a transformers checkpoint directory)")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ConversionError(f"{out_dir} exists and is not empty")
    cfg = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    if cfg.model_type not in SUPPORTED:
        raise ConversionError(f"model type {cfg.model_type!r}: this converter takes {', '.join(SUPPORTED)}")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir, local_files_only=True,
                                                               dtype=torch.float32).eval()
    if cfg.model_type == "marian":
        conv = marian.convert(transformers, hf_dir, cfg, model)
    elif cfg.model_type == "bart":
        conv = bart.convert(transformers, hf_dir, cfg, model)
    else:
        if "src" in (source_lang, target_lang) or "tgt" in (source_lang, target_lang):
            raise ConversionError("a multilingual model translates the pair named by --source-lang and "
                                  "--target-lang (language codes of its tokenizer, e.g. eng_Latn deu_Latn)")
        family = mbart if cfg.model_type == "mbart" else m2m100
        conv = family.convert(transformers, hf_dir, cfg, model, source_lang, target_lang)
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".import-", dir=parent)
    try:
        for lang in (source_lang, target_lang):
            with open(os.path.join(work, f"dict.{lang}.txt"), "w", encoding="utf-8") as f:
                f.writelines(f"{w} 1\n" for w in conv.words)
        args = model_args(cfg, conv.flags, work, source_lang, target_lang)
        ckpt = {"args": None, "cfg": convert_namespace_to_omegaconf(args), "model": conv.state,
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "extra_state": {}, "last_optimizer_state": {}}
        ckpt["cfg"]["task"]["data"] = "."  # the directory it is loaded from
        ckpt["cfg"]["generation"]["min_len"] = 0  # transformers' generate may end a sentence at once
        torch.save(ckpt, os.path.join(work, "model.pt"))
        for name, src in conv.files.items():
            if isinstance(src, bytes):
                with open(os.path.join(work, name), "wb") as f:
                    f.write(src)
            else:
                shutil.copyfile(src, os.path.join(work, name))
        meta = {"arch": "hf_transformer", "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
                "embed_dim": cfg.d_model, "ffn_dim": cfg.encoder_ffn_dim, "source_lang": source_lang,
                "target_lang": target_lang, "parameters": sum(p.numel() for p in model.parameters()),
                "imported_from": {"model_type": cfg.model_type, "path": os.path.abspath(hf_dir),
                                  "token_ids": conv.token_ids},
                "storage": "float32"}
        if conv.text is not None:
            meta["text"] = conv.text
        with open(os.path.join(work, "MODEL.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # (empty)
        os.rename(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return meta
