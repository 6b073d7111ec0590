"""Beam search on the native engine (:class:`NativeBeamGenerator`): fairseq's
``SequenceGenerator`` with ``BeamSearch``, step for step, in one engine call
per batch (``native/csrc/beam_search.h``): the same hypotheses, order and
scores (up to the last bits of float32 sums), for ``--beam``, ``--nbest``,
``--lenpen``, ``--unkpen``, ``--min-len``, ``--max-len-a/-b``,
``--temperature``, ``--unnormalized`` and ``--no-repeat-ngram-size``.

``--no-repeat-ngram-size`` blocks what fairseq's CUDA kernel blocks (an
n-gram the hypothesis already holds); fairseq's CPU fallback compares the
hypothesis buffer's padded tail and so blocks nothing on a CPU.
"""
import logging
from typing import Dict, List

import torch

logger = logging.getLogger("fairseq_aggressive")


class NativeBeamGenerator:
    """A fairseq generator (``generate(models, sample)``) decoding with
    ``engine`` (a :class:`~fairseq_aggressive.native.NativeEngine` of the
    model); batches the engine cannot take (positions beyond its tables) go
    to ``fallback`` (fairseq's own SequenceGenerator with the same settings)."""

    def __init__(self, engine, tgt_dict, fallback, beam_size: int = 5, max_len_a: float = 0.0,
                 max_len_b: int = 200, max_len: int = 0, min_len: int = 1, len_penalty: float = 1.0,
                 unk_penalty: float = 0.0, temperature: float = 1.0, normalize_scores: bool = True,
                 no_repeat_ngram_size: int = 0, max_positions: int = 1024):
        if beam_size < 1:
            raise ValueError(f"--beam must be >= 1, got {beam_size}")
        if not temperature > 0:
            raise ValueError(f"--temperature must be greater than 0, got {temperature}")
        if 2 * beam_size > len(tgt_dict):
            raise ValueError(f"--beam {beam_size}: twice the beam must fit the vocabulary ({len(tgt_dict)} types)")
        self.engine, self.fallback = engine, fallback
        self.beam_size = beam_size
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.max_len = max_len or max_positions
        self.min_len, self.len_penalty, self.unk_penalty = min_len, len_penalty, unk_penalty
        self.temperature, self.normalize_scores = temperature, normalize_scores
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.pad, self.eos = tgt_dict.pad(), tgt_dict.eos()
        self.vocab_size = len(tgt_dict)

    def batch_max_len(self, src_len: int) -> int:
        """fairseq's output length limit of a batch whose padded source has ``src_len`` tokens."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_len - 1)

    @torch.no_grad()
    def generate(self, models, sample: Dict, **kwargs) -> List[List[Dict[str, torch.Tensor]]]:
        if kwargs.get("prefix_tokens") is not None or kwargs.get("constraints") is not None:
            raise ValueError("prefix tokens and constraints are not supported by beam search on the engine")
        src_tokens = sample["net_input"]["src_tokens"]
        max_len = self.batch_max_len(src_tokens.size(1))
        if self.min_len > max_len:
            raise ValueError("min_len cannot be larger than max_len, please adjust these!")
        lengths = src_tokens.ne(self.pad).sum(1)
        if not self.engine.can_decode(int(lengths.max()), max_len):
            return self.fallback.generate(models, sample, **kwargs)
        batch = self.engine.begin(src_tokens, 0)
        bos = kwargs.get("bos_token")
        # every ended hypothesis, best first, as fairseq's generator returns them (--nbest picks the first)
        hyps = batch.decode_beam(self.beam_size, self.beam_size, self.eos if bos is None else bos, max_len, self.min_len,
                                 self.unk_penalty, self.temperature, self.len_penalty, self.normalize_scores,
                                 self.no_repeat_ngram_size)
        empty = torch.empty(0)
        return [[{"tokens": torch.tensor(h["tokens"], dtype=torch.long), "score": torch.tensor(h["score"]),
                  "attention": empty, "alignment": empty,
                  "positional_scores": torch.tensor(h["positional_scores"], dtype=torch.float32)} for h in sent]
                for sent in hyps]
