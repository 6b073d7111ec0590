"""Sentences in, sentences out, with one generator kept: a per-sentence API.

fairseq's hub interface (``TransformerModel.from_pretrained(...).translate``)
builds a generator configuration, a dataset and a batch iterator on every call;
for one sentence at a time those cost more than an aggressive decode of it.  A
``Translator`` builds its generator once and hands each call's tokens to it
directly, or, where its decoding runs in the engine's running batch, streams
them through that batch's rows.  Its outputs are the hub's
``translate(sentence, beam=1, **settings)``: the same tokenizer, BPE,
dictionary, generation settings and length limits.

    from fairseq_aggressive import Translator
    t = Translator.from_pretrained("models/uagec-9x3", decoding="iad")
    t.translate("вхідне речення")
    t.translate_batch(["перше речення", "друге речення"])

One generator decodes one batch at a time: calls from several threads on one
``Translator`` take turns.  For decoding in parallel, make one ``Translator``
per thread on one hub model (``Translator(hub, ...)``) with ``native_threads``
set to the CPUs divided by the threads: their engines read one copy of the
model's weights, each with its own threads and buffers.
"""
import copy
import json
import os
import threading
from typing import List, Optional, Sequence

import torch
from fairseq import utils
from fairseq.data import data_utils
from omegaconf import open_dict

from fairseq_aggressive.tasks.aggressive_translation import _values


class Translator:
    """One hub model's generator, built once, called per sentence or per batch.

    ``hub``: a fairseq hub interface (``TransformerModel.from_pretrained``);
    ``settings``: generation settings as ``hub.translate`` takes them
    (``decoding="iad"``, ``inference_precision="int8"``, ``native_threads=1``,
    ...); ``beam`` defaults to 1.
    """

    def __init__(self, hub, **settings):
        settings.setdefault("beam", 1)
        cfg = copy.deepcopy(hub.cfg.generation)
        known = set(_values(cfg)) | set(_values(hub.task.cfg))
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown generation setting(s) {', '.join(unknown)} for task {type(hub.task).__name__}")
        with open_dict(cfg):
            for key, value in settings.items():
                setattr(cfg, key, value)
        self.hub = hub
        self.settings = dict(settings)
        # a generator of its own (the task hands a thread's last one back to the hub's
        # translate() calls, not to a caller that passes arguments of its own)
        self.generator = hub.task.build_generator(hub.models, cfg, extra_gen_cls_kwargs={})
        self._max_tokens = utils.resolve_max_positions(hub.task.max_positions(),
                                                       *[m.max_positions() for m in hub.models])
        self._limit = _source_limit(self._max_tokens)
        self._left_pad = bool(hub.task.cfg.left_pad_source)  # (an OmegaConf read costs per call)
        suffix = hub.task.source_suffix_ids() if hasattr(hub.task, "source_suffix_ids") else []
        self._suffix = torch.tensor(suffix, dtype=torch.long) if suffix else None
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir: str, checkpoint_file: str = "model.pt", data_name_or_path: str = None,
                        bpe_codes: str = None, source_lang: str = None, target_lang: str = None, **settings):
        """A model directory as under ``models/`` (:func:`load_hub`)."""
        hub = load_hub(model_dir, checkpoint_file, data_name_or_path, bpe_codes, source_lang, target_lang)
        return cls(hub, **settings)

    def encode(self, sentence: str) -> torch.Tensor:
        """A sentence's source ids: the hub's ``encode`` (tokenized, BPE, EOS) and the
        task's ``--source-suffix`` (an imported mBART model's source language)."""
        ids = self.hub.encode(sentence)
        return ids if self._suffix is None else torch.cat([ids, self._suffix])

    def translate(self, sentence: str) -> str:
        """The output for one sentence: where the decoding runs in the engine's running
        batch, that sentence through one row of it (:meth:`translate_batch`, whose passes
        keep no scores and project through the screen), else, and for a sentence the running
        batch refuses, the generator's batch of one (:meth:`translate_static`, which keeps
        every position's score); either way the same output."""
        if not isinstance(sentence, str):
            raise TypeError("translate takes one sentence (a str); translate_batch takes a list")
        if self.running_decoder() is not None:
            try:
                return self.translate_batch([sentence], rows=1)[0]
            except ValueError:  # what the running batch refuses, the generator decodes (or says why it cannot)
                pass
        return self.translate_static([sentence])[0]

    def translate_batch(self, sentences: Sequence[str], rows: int = 32, lanes: Optional[int] = None) -> List[str]:
        """The outputs for a list of sentences, in their order, each the sentence's own
        (``translate_static([s])``'s, the generator's batch of one).
        Where the decoding runs in the engine's running batch (IAD, greedy with
        ``max_draft_len=0``, a native feature drafter) they stream through ``rows``
        rows, a row that ends refilled at the next pass boundary, the rows split among
        ``lanes`` running batches of one thread each (default: ``NativeEngine.default_lanes``, a stream's);
        any other decoding goes in static batches of ``rows``."""
        from .runtime.gc_pause import gc_paused
        from .streaming import stream

        if isinstance(sentences, str):
            raise TypeError("translate_batch takes a list of sentences; translate takes one")
        with self._lock:
            with gc_paused():
                return list(stream(self, list(sentences), rows, decoder=self.running_decoder(), locked=True,
                                   lanes=lanes))

    def running_decoder(self):
        """The :class:`~fairseq_aggressive.streaming.RunningDecoder` of this Translator's
        decoding, or None where it does not run in the engine's running batch."""
        if not hasattr(self, "_running"):
            from .streaming import RunningDecoder

            self._running = RunningDecoder.of(self)
        return self._running

    def translate_static(self, sentences: Sequence[str], locked: bool = False, first_index: int = 0) -> List[str]:
        """The outputs for a batch of sentences, in their order, decoded as one batch
        by the generator (fairseq's batch: its length limit is its longest source's);
        errors name a sentence by its index plus ``first_index``."""
        if isinstance(sentences, str):
            raise TypeError("translate_static takes a list of sentences; translate takes one")
        if not sentences:
            return []
        tokens = [self.encode(s) for s in sentences]
        for i, t in enumerate(tokens):
            if self._limit is not None and t.numel() > self._limit:
                raise ValueError(f"sentence {i + first_index} is {t.numel()} tokens long after BPE; "
                                 f"the model takes at most {self._limit}")
        d = self.hub.src_dict
        src = data_utils.collate_tokens(tokens, d.pad(), d.eos(), left_pad=self._left_pad)
        lengths = torch.tensor([t.numel() for t in tokens])
        sample = {"id": torch.arange(len(tokens)), "nsentences": len(tokens), "ntokens": int(lengths.sum()),
                  "net_input": {"src_tokens": src.to(self.hub.device), "src_lengths": lengths.to(self.hub.device)}}
        with (_NoLock() if locked else self._lock), torch.no_grad():
            hypos = self.hub.task.inference_step(self.generator, self.hub.models, sample)
        # the dictionary's string() reads a list of ints as it reads a tensor, without a
        # tensor element per token
        return [self.hub.decode(h[0]["tokens"].tolist()) for h in hypos]


class _NoLock:
    """(the caller holds the Translator's lock)"""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def model_languages(model_dir: str):
    """(source, target) languages from ``MODEL_DIR/MODEL.json`` (None for each it lacks)."""
    meta = os.path.join(model_dir, "MODEL.json")
    if not os.path.exists(meta):
        return None, None
    with open(meta, encoding="utf-8") as f:
        langs = json.load(f)
    return langs.get("source_lang"), langs.get("target_lang")


TEXT_FILES = ("sentencepiece_model", "gpt2_encoder_json", "gpt2_vocab_bpe")


def model_text(model_dir: str) -> dict:
    """The subword settings (``--bpe hf_sentencepiece`` or ``hf_gpt2`` and their
    options, files named within the directory) that an imported model's
    ``MODEL.json`` gives (``text``); fairseq's SentencePiece BPE over a
    ``source.spm`` where it gives none; else {}."""
    path = os.path.join(model_dir, "MODEL.json")
    text = {}
    if os.path.isfile(path):
        with open(path) as f:
            text = dict(json.load(f).get("text") or {})
    if not text and os.path.isfile(os.path.join(model_dir, "source.spm")):
        text = {"bpe": "sentencepiece", "sentencepiece_model": "source.spm"}
    for key in TEXT_FILES:
        if key in text:
            text[key] = os.path.join(model_dir, text[key])
    return text


def load_hub(model_dir: str, checkpoint_file: str = "model.pt", data_name_or_path: str = None, bpe_codes: str = None,
             source_lang: str = None, target_lang: str = None):
    """The hub model (in eval mode) of a directory as under ``models/``: the checkpoint, its
    dictionaries, ``bpe.codes`` (subword-nmt) or ``source.spm`` (SentencePiece, an imported
    model's) and ``MODEL.json`` (the languages, when not given)."""
    from fairseq.models.transformer import TransformerModel

    import fairseq_aggressive  # noqa: F401  (registers the task)

    src, tgt = model_languages(model_dir)
    source_lang, target_lang = source_lang or src, target_lang or tgt
    if not source_lang or not target_lang:
        raise ValueError(f"{model_dir}: no MODEL.json with source_lang and target_lang; pass both")
    codes = bpe_codes or os.path.join(model_dir, "bpe.codes")
    extra = {"bpe": "subword_nmt", "bpe_codes": codes} if os.path.exists(codes) else model_text(model_dir)
    hub = TransformerModel.from_pretrained(model_dir, checkpoint_file, data_name_or_path or model_dir,
                                           source_lang=source_lang, target_lang=target_lang, **extra)
    return hub.eval()


def _source_limit(max_positions):
    """The most source tokens (fairseq's max positions: a number, a (source, target) pair, or None)."""
    return max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions
