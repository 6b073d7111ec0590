"""The subword step of an imported Hugging Face model: fairseq's SentencePiece
BPE (``--bpe hf_sentencepiece``) or GPT-2 byte-level BPE (``--bpe hf_gpt2``,
BART's), plus what transformers' tokenizer adds around the pieces.

- ``--source-prefix SYMBOLS``: dictionary symbols put before a source
  sentence's pieces (M2M100's and NLLB's source language token, BART's
  ``<s>``); fairseq then appends EOS, as transformers' tokenizers do.
- ``--drop-symbols SYMBOLS``: symbols left out of a decoded output, as
  transformers' ``decode(skip_special_tokens=True)`` leaves out its special
  tokens (a forced target language token, ``<s>``, ``<unk>``).

Both are comma-separated; the importer stores them in the model directory's
``MODEL.json`` (``text``), and ``Translator.from_pretrained``, the server and
``fairseq-interactive`` (given the same options) read text through them.
"""
from dataclasses import dataclass, field

from fairseq.data.encoders import register_bpe
from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig
from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig


@dataclass
class HFSentencepieceConfig(SentencepieceConfig):
    source_prefix: str = field(default="", metadata={"help": "comma-separated symbols before every source's pieces"})
    drop_symbols: str = field(default="", metadata={"help": "comma-separated symbols left out of decoded outputs"})


@dataclass
class HFGPT2Config(GPT2BPEConfig):
    source_prefix: str = field(default="", metadata={"help": "comma-separated symbols before every source's pieces"})
    drop_symbols: str = field(default="", metadata={"help": "comma-separated symbols left out of decoded outputs"})


def _symbols(spec: str):
    return [s for s in (spec or "").split(",") if s]


class _AroundPieces:
    """``--source-prefix`` and ``--drop-symbols`` around a fairseq BPE's own encode and decode."""

    def _around(self, cfg):
        self.prefix = " ".join(_symbols(cfg.source_prefix))
        self.drop = frozenset(_symbols(cfg.drop_symbols))
        for s in list(self.drop) + self.prefix.split():
            if any(c.isspace() for c in s):
                raise ValueError(f"--source-prefix, --drop-symbols: symbol {s!r} has white space")

    def encode(self, x: str) -> str:
        pieces = super().encode(x)
        return f"{self.prefix} {pieces}" if self.prefix and pieces else self.prefix or pieces

    def decode(self, x: str) -> str:
        if self.drop:
            x = " ".join(s for s in x.split() if s not in self.drop)
        return super().decode(x)


@register_bpe("hf_sentencepiece", dataclass=HFSentencepieceConfig)
class HFSentencepieceBPE(_AroundPieces, SentencepieceBPE):
    def __init__(self, cfg):
        super().__init__(cfg)
        self._around(cfg)


@register_bpe("hf_gpt2", dataclass=HFGPT2Config)
class HFGPT2BPE(_AroundPieces, GPT2BPE):
    """fairseq's GPT-2 byte-level BPE over a transformers tokenizer's
    ``vocab.json`` and merges (``--gpt2-encoder-json``, ``--gpt2-vocab-bpe``):
    its pieces are the tokenizer's ids, which the dictionary lists by number."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self._around(cfg)
