"""Beam search on the native engine (:class:`NativeBeamGenerator`): fairseq's
``SequenceGenerator`` with ``BeamSearch``, step for step, in one engine call
per batch (``native/csrc/beam/beam_search.h``): the same hypotheses, order and
scores (up to the last bits of float32 sums), for ``--beam``, ``--nbest``,
``--lenpen``, ``--unkpen``, ``--min-len``, ``--max-len-a/-b``,
``--temperature``, ``--unnormalized`` and ``--no-repeat-ngram-size``.

With a copy source (``--decoding iad --beam N``), the engine drafts the best
hypothesis of each beam from its source and reads the hypotheses that extend
a draft from that pass's later positions: the same output, with fewer rows
in the passes (docs/how-it-works.md, "Drafted beam search").

``--no-repeat-ngram-size`` blocks what fairseq's CUDA kernel blocks (an
n-gram the hypothesis already holds); fairseq's CPU fallback compares the
hypothesis buffer's padded tail and so blocks nothing on a CPU.
"""
from typing import Dict, List, Optional

import torch


def native_beam_from(fallback, models, tgt_dict, threads: Optional[int] = None, isa: Optional[str] = None,
                     drafts: Optional["CopyDrafts"] = None):
    """The engine's beam search with the settings of ``fallback``, the
    SequenceGenerator fairseq built for the same arguments (it decodes what the
    engine cannot take), drafted with ``drafts`` if given; a ValueError naming
    what the engine does not do."""
    from fairseq.search import BeamSearch
    from fairseq.sequence_generator import SequenceGenerator

    from .engine import NativeEngine

    if len(models) != 1:
        raise ValueError(f"--engine native decodes with a single model, got an ensemble of {len(models)}")
    if type(fallback) is not SequenceGenerator or type(fallback.search) is not BeamSearch:
        raise ValueError(f"--engine native decodes plain beam search, not {type(fallback).__name__} with "
                         f"{type(fallback.search).__name__} (--sampling, --diverse-beam-groups, --diversity-rate, "
                         "--constraints, --prefix-size and --print-alignment are fairseq's own; use --engine torch)")
    if fallback.match_source_len or fallback.lm_model is not None:
        raise ValueError("--match-source-len and --lm-path are not supported by --engine native; use --engine torch")
    model = models[0]
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("--engine native decodes on the CPU: the model is not on the CPU")
    engine = NativeEngine.for_model(model, tgt_dict, isa=isa, threads=threads)
    blocker = fallback.repeat_ngram_blocker
    return NativeBeamGenerator(
        engine, tgt_dict, fallback, beam_size=fallback.beam_size, max_len_a=fallback.max_len_a,
        max_len_b=fallback.max_len_b, max_len=fallback.max_len, min_len=fallback.min_len,
        len_penalty=fallback.len_penalty, unk_penalty=fallback.unk_penalty, temperature=fallback.temperature,
        normalize_scores=fallback.normalize_scores,
        no_repeat_ngram_size=blocker.no_repeat_ngram_size if blocker is not None else 0, drafts=drafts)


class CopyDrafts:
    """How beam search drafts from the source: ``copy_source(sample)`` gives
    each sentence's copy source in target ids (flat int32 array, lengths), as
    IAD's drafter gives it; drafts of at most ``max_draft`` tokens; re-anchoring
    on output suffixes of ``ngram_min`` .. ``ngram_max`` tokens."""

    def __init__(self, copy_source, max_draft: int, ngram_min: int = 1, ngram_max: int = 4):
        if max_draft < 0:
            raise ValueError(f"--max-draft-len must be >= 0, got {max_draft}")
        self.copy_source, self.max_draft = copy_source, max_draft
        self.ngram_min, self.ngram_max = ngram_min, ngram_max


class NativeBeamGenerator:
    """A fairseq generator (``generate(models, sample)``) decoding with
    ``engine`` (a :class:`~fairseq_aggressive.native.NativeEngine` of the
    model); batches the engine cannot take (positions beyond its tables) go
    to ``fallback`` (fairseq's own SequenceGenerator with the same settings)."""

    def __init__(self, engine, tgt_dict, fallback, beam_size: int = 5, max_len_a: float = 0.0,
                 max_len_b: int = 200, max_len: int = 0, min_len: int = 1, len_penalty: float = 1.0,
                 unk_penalty: float = 0.0, temperature: float = 1.0, normalize_scores: bool = True,
                 no_repeat_ngram_size: int = 0, max_positions: int = 1024, drafts: Optional[CopyDrafts] = None):
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
        self.drafts = drafts
        self.counts = None  # the last batch's BeamCounts (native/c_api.py)
        self.totals = {}  # every batch's counts added up, by name

    @property
    def native(self):
        """The engine (the benchmark runs a generator that has one with the engine's modes)."""
        return self.engine

    def batch_max_len(self, src_len: int) -> int:
        """fairseq's output length limit of a batch whose padded source has ``src_len`` tokens."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_len - 1)

    @torch.no_grad()
    def generate(self, models, sample: Dict, **kwargs) -> List[List[Dict[str, torch.Tensor]]]:
        if kwargs.get("constraints") is not None:
            raise ValueError("constraints are not supported by beam search on the engine")
        if kwargs.get("prefix_tokens") is not None:  # (an imported model's forced first token): fairseq's own
            return self.fallback.generate(models, sample, **kwargs)
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
        draft = {}
        if self.drafts is not None:
            src, src_len = self.drafts.copy_source(sample)
            draft = dict(src=src, src_len=src_len, max_draft=self.drafts.max_draft, ngram_min=self.drafts.ngram_min,
                         ngram_max=self.drafts.ngram_max)
        hyps, self.counts = batch.decode_beam(
            self.beam_size, self.beam_size, self.eos if bos is None else bos, max_len, self.min_len, self.unk_penalty,
            self.temperature, self.len_penalty, self.normalize_scores, self.no_repeat_ngram_size, **draft)
        for name, _ in type(self.counts)._fields_:
            self.totals[name] = self.totals.get(name, 0) + getattr(self.counts, name)
        empty = torch.empty(0)
        return [[{"tokens": torch.from_numpy(h["tokens"]).long(), "score": torch.tensor(h["score"]),
                  "attention": empty, "alignment": empty,
                  "positional_scores": torch.from_numpy(h["positional_scores"].copy())} for h in sent]
                for sent in hyps]
