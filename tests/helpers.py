"""Shared test helpers: tiny dictionaries, random-weight Transformers, stock greedy."""
import argparse

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fairseq_aggressive  # noqa: F401
from fairseq_aggressive.tasks.aggressive_translation import (
    AggressiveTranslationConfig,
    AggressiveTranslationTask,
)


def make_dict(n_symbols=40):
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def make_task(src_dict=None, tgt_dict=None, **cfg):
    src_dict = src_dict or make_dict()
    tgt_dict = tgt_dict or src_dict
    return AggressiveTranslationTask(AggressiveTranslationConfig(**cfg), src_dict, tgt_dict)


def make_model(task, arch="transformer", seed=0, **overrides):
    """A random-weight fairseq Transformer; ``overrides`` are model args."""
    defaults = dict(
        encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
        encoder_layers=2, decoder_embed_dim=32, decoder_ffn_embed_dim=64,
        decoder_attention_heads=4, decoder_layers=2, dropout=0.0,
        max_source_positions=256, max_target_positions=256,
    )
    defaults.update(overrides)
    args = argparse.Namespace(**defaults)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    # sharpen the random output layer so greedy choices are far from ties
    with torch.no_grad():
        for p in model.decoder.output_projection.parameters():
            p.mul_(4.0)
    return model.eval()


def make_sample(src_rows, pad, left_pad=True):
    """A fairseq sample from lists of token ids (each ending with EOS)."""
    n = max(len(r) for r in src_rows)
    toks = torch.full((len(src_rows), n), pad, dtype=torch.long)
    for i, r in enumerate(src_rows):
        if left_pad:
            toks[i, n - len(r):] = torch.tensor(r)
        else:
            toks[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in src_rows])
    return {"id": torch.arange(len(src_rows)), "net_input": {"src_tokens": toks, "src_lengths": lengths}}


def greedy(model, tgt_dict, sample, **kw):
    gen = SequenceGenerator([model], tgt_dict, beam_size=1, **kw)
    return gen.generate([model], sample)
