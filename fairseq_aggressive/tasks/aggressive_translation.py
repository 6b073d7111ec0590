"""Task ``aggressive_translation``: fairseq's translation task whose generator
is chosen by ``--decoding`` (``beam`` = stock SequenceGenerator; ``iad``,
``gad``, ``blockwise`` = aggressive decoding, built by
:mod:`fairseq_aggressive.decoding`), decoding in int8 on request
(``--inference-precision``), symbols after every source's EOS
(``--source-suffix``, an imported mBART model's), plus opt-in CPU bfloat16 training (only where the
CPU does it natively: :mod:`fairseq_aggressive.runtime.cpu_features`).  The same task
trains the AR models and (``--block-size``) the block drafter.  Its options:
:mod:`fairseq_aggressive.tasks.config`."""
import copy
import os
import threading
from typing import List

import numpy as np
import torch
from fairseq.data import AppendTokenDataset
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationTask
from omegaconf import DictConfig, OmegaConf

from ..runtime.cpu_features import use_bf16
from ..decoding import build_aggressive_generator, check_task_options
from ..decoding_options import DecodingOptions
from ..drafters import load_block_drafter
from ..models.hf_transformer import decoder_start, forced_first
from ..runtime.fingerprint import model_fingerprint
from ..runtime.quantization import is_int8, quantize_int8
from .config import AggressiveTranslationConfig

__all__ = ["AggressiveTranslationTask", "AggressiveTranslationConfig"]


@register_task("aggressive_translation", dataclass=AggressiveTranslationConfig)
class AggressiveTranslationTask(TranslationTask):
    cfg: AggressiveTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        check_task_options(cfg)
        self._drafters = {}
        self._train_bf16 = None
        self._last = threading.local()  # this thread's last aggressive generator and what it was built from

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        generator = self._build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs)
        return starting_from(generator, decoder_start(models[0], self.target_dictionary), forced_first(models[0]))

    def _build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        given, cfg = _values(args), _values(self.cfg)
        if str(_pick(given, cfg, "inference_precision")) == "int8":
            for model in models:
                quantize_int8(model)
        elif any(is_int8(model) for model in models):
            raise ValueError("this model was quantized in place by an earlier --inference-precision int8 "
                             "(e.g. a hub model's translate(inference_precision='int8')); load it again "
                             "to decode in float32")
        opts = DecodingOptions.read(lambda name: _pick(given, cfg, name))
        if not opts.aggressive or given.get("score_reference"):
            generator = super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs)
            if opts.engine == "native" and not given.get("score_reference") and seq_gen_cls is None:
                # beam search (greedy at --beam 1) in the engine, fairseq's own for what it cannot take
                from ..native.beam import native_beam_from

                return native_beam_from(generator, models, self.target_dictionary, threads=opts.native_threads,
                                        isa=opts.native_isa)
            return generator
        # A hub model's translate() builds a generator per call: the thread's last one
        # serves again while nothing it was built from changed (its engine, threads and
        # scratch stay; a generator decodes one batch at a time, so each thread has its own).
        key = None
        if seq_gen_cls is None and extra_gen_cls_kwargs is None and all(v is None for v in kwargs.values()):
            key = (tuple((id(m), model_fingerprint(m)) for m in models), _settings(given), _settings(cfg))
        last = getattr(self._last, "built", None)
        if key is not None and last is not None and last[0] == key:
            return last[1]
        self._last.built = None  # the old one goes before the new one is made
        generator = build_aggressive_generator(self, models, args, opts, **kwargs)
        if key is not None:
            self._last.built = (key, generator)
        return generator

    def decoding_options(self, args=None) -> DecodingOptions:
        """The decoding options, checked: ``args`` (per-call generation
        arguments, hub API) win over the task configuration."""
        given, cfg = _values(args), _values(self.cfg)
        return DecodingOptions.read(lambda name: _pick(given, cfg, name))

    def load_drafter(self, path: str, like=None, dtype=None, precision: str = "float32"):
        """The block_nat drafter at ``path`` and its training block size, on the
        device and in the dtype of the module ``like`` (or ``dtype``); with
        ``precision`` int8, an int8 copy of it (``--drafter-precision``); each
        loaded once per task (hub models decode many times)."""
        param = next(like.parameters()) if like is not None else None
        device = param.device if param is not None else None
        dtype = dtype or (param.dtype if param is not None else None)
        if precision == "int8":
            dtype = torch.float32
        key = (os.path.abspath(path), device, dtype, precision)
        if key not in self._drafters:
            if precision == "int8":
                model, trained_k = self.load_drafter(path, like, dtype)
                self._drafters[key] = (quantize_int8(copy.deepcopy(model)).eval(), trained_k)
            else:
                self._drafters[key] = load_block_drafter(self, path, device=device, dtype=dtype)
        return self._drafters[key]

    # ------------------------------------------------------------ sources
    def source_suffix_ids(self) -> List[int]:
        """The source dictionary's ids of ``--source-suffix`` (symbols after every
        source's EOS), [] without; a symbol the dictionary lacks is an error."""
        d = self.source_dictionary
        symbols = [s for s in (getattr(self.cfg, "source_suffix", "") or "").split(",") if s]
        missing = [s for s in symbols if s not in d.indices]
        if missing:
            raise ValueError(f"--source-suffix: {', '.join(missing)} not in the source dictionary")
        return [d.index(s) for s in symbols]

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        suffix = self.source_suffix_ids()
        if suffix:  # fairseq's AppendTokenDataset after the binarized EOS, sizes kept in step
            ds = self.datasets[split]
            for i in suffix:
                ds.src = AppendTokenDataset(ds.src, i)
            ds.src_sizes = np.array(ds.src.sizes)
            ds.sizes = np.vstack((ds.src_sizes, ds.tgt_sizes)).T if ds.tgt_sizes is not None else ds.src_sizes

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        suffix = self.source_suffix_ids()
        if suffix:
            src_tokens = [torch.cat([t, t.new_tensor(suffix)]) for t in src_tokens]
            src_lengths = [int(n) + len(suffix) for n in src_lengths]
        return super().build_dataset_for_inference(src_tokens, src_lengths, constraints=constraints)

    # ------------------------------------------------------------ batching
    def get_batch_iterator(self, dataset, *args, required_batch_size_multiple=1, **kwargs):
        """Every sentence of a decoded or validated split gets batched.

        fairseq's ``batch_by_size`` drops a last batch whose size is not a multiple of
        ``--required-batch-size-multiple`` (default 8; fairseq issue #5036), so stock
        ``fairseq-generate`` silently skips up to 7 test sentences.  The multiple is kept
        for the training split only, where it serves fp16 efficiency.

        Sharded decoding (``--distributed-world-size S --distributed-rank R``)
        splits the batches among the shards; fairseq-generate fails at its end
        (a division by zero in its speed report) on a shard that got no batch, so
        when a split has fewer batches than shards its sentences are spread over
        S batches (as long as it has S sentences): every shard decodes some.
        (In training, fewer batches than processes is a degenerate case anyway.)"""
        if dataset is not self.datasets.get(self._train_split()):
            required_batch_size_multiple = 1
        itr = super().get_batch_iterator(
            dataset, *args, required_batch_size_multiple=required_batch_size_multiple, **kwargs)
        shards = kwargs.get("num_shards", 1)
        batches = getattr(itr, "frozen_batches", None)
        if shards > 1 and batches is not None and len(batches) < shards:
            ids = [i for b in batches for i in b]
            if len(ids) >= shards:
                itr._frozen_batches = tuple(ids[len(ids) * s // shards: len(ids) * (s + 1) // shards]
                                            for s in range(shards))
        return itr

    def _train_split(self):
        return getattr(self.cfg, "train_subset", None) or "train"

    # ------------------------------------------------------------ training
    def _autocast(self):
        if self._train_bf16 is None:  # decided once, on the first step
            self._train_bf16 = use_bf16(self.cfg.cpu_bf16, "--cpu-bf16")
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._train_bf16)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        with self._autocast():
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        with self._autocast():
            return super().valid_step(sample, model, criterion)



def _values(args) -> dict:
    """Generation arguments or a task configuration as a plain dict (an OmegaConf
    config read key by key costs tens of microseconds per missing key)."""
    if args is None:
        return {}
    if isinstance(args, DictConfig):
        return OmegaConf.to_container(args, resolve=False)
    return dict(vars(args))


def _pick(given: dict, cfg: dict, name: str):
    """A decoding option: the per-call generation argument (hub API) wins over the task's."""
    value = given.get(name)
    return value if value is not None else cfg.get(name)


def _settings(values: dict) -> str:
    """``values`` comparable across calls (a hub call's arguments are a fresh copy)."""
    return repr(sorted(values.items(), key=lambda kv: kv[0]))


def starting_from(generator, bos, forced=None):
    """``generator``, whose decoding starts from ``bos`` where no call names
    another start (an imported model's own start token: models/hf_transformer.py;
    None: fairseq's EOS) and whose outputs start with ``forced`` (an imported
    model's forced first token, or None); its ``start_token`` says which (the
    running batch starts its rows there too).  An aggressive generator's
    verifier applies ``forced`` itself (its score rules); fairseq's generators
    and the engine's beam search get it as the prefix token of calls that
    name none."""
    if forced is not None:  # fairseq-generate's printed outputs leave it out, as transformers' decode does
        strip = getattr(generator, "symbols_to_strip_from_output", None) or {generator.eos}
        generator.symbols_to_strip_from_output = set(strip) | {forced}
    prefix = forced is not None and not hasattr(generator, "verifier")
    if (bos is None or getattr(generator, "start_token", None) == bos) and not prefix:
        return generator
    generate = type(generator).generate.__get__(generator)

    def generate_from_start(models, sample, *args, **kwargs):
        if bos is not None and kwargs.get("bos_token") is None:
            kwargs["bos_token"] = bos
        if prefix and kwargs.get("prefix_tokens") is None:
            src = sample["net_input"]["src_tokens"]
            kwargs["prefix_tokens"] = src.new_full((src.size(0), 1), forced)
        return generate(models, sample, *args, **kwargs)

    generator.generate = generate_from_start
    if bos is not None:
        generator.start_token = bos
    return generator
