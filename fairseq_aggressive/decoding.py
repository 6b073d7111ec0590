"""What ``--decoding`` builds: the drafter and acceptance rule of each
aggressive decoding and the :class:`AggressiveGenerator` around them.

``option(name)`` reads one decoding option; the task passes its own, where
per-call generation arguments (hub API) win over the task configuration."""
import atexit
import logging
from typing import Callable

import torch

from .acceptance import build_acceptance, build_blockwise_acceptance
from .constants import DECODINGS  # beam = fairseq's own SequenceGenerator
from .cpu_features import use_bf16
from .options import (check_block_size, check_isa, check_draft_cost, check_generation_args, check_iad_branches,
                      check_max_draft_len, check_shortlist)
from .threads import engine_threads, parse_threads

logger = logging.getLogger("fairseq_aggressive")



def build_drafter_and_rule(decoding: str, task, models, option: Callable[[str], object]):
    """(drafter, acceptance rule) of an aggressive ``decoding``."""
    if decoding == "iad":
        from .drafters import InputCopyDrafter

        drafter = InputCopyDrafter(task.source_dictionary, task.target_dictionary,
                                   ngram_min=option("iad_ngram_min"), ngram_max=option("iad_ngram_max"),
                                   branches=option("iad_branches") or 1)
        return drafter, build_acceptance()
    if decoding == "blockwise":
        from .drafters import BlockwiseHeadsDrafter

        drafter = BlockwiseHeadsDrafter(models[0], task.target_dictionary)
        rule = build_blockwise_acceptance(option("blockwise_topk"), option("min_block_size"),
                                          block_size=models[0].blockwise_k)
        return drafter, rule
    if decoding == "gad":
        return build_gad_drafter(task, models, option), build_acceptance(option("gad_beta"), option("gad_tau"))
    raise ValueError(f"unknown --decoding {decoding!r}; choose from {', '.join(DECODINGS)}")


def build_gad_drafter(task, models, option):
    """GAD's NAR block drafter from ``--drafter-path``, checked against the verifier."""
    from .drafters import NARBlockDrafter, check_drafter

    path = option("drafter_path")
    if not path:
        raise ValueError("--decoding gad needs a drafter: pass --drafter-path DRAFTER.pt")
    dtype = torch.bfloat16 if use_bf16(option("drafter_bf16"), "--drafter-bf16") else None
    drafter_model, trained_k = task.load_drafter(path, like=models[0], dtype=dtype)
    check_drafter(drafter_model, models[0], task.target_dictionary)
    k = option("block_size")
    if k is None:
        k = trained_k or 25
    # the drafter follows --engine: torch keeps it in torch, otherwise native where it runs
    engine = "torch" if str(option("engine")) == "torch" else "auto"
    shortlist = None
    if option("drafter_shortlist") is not None:
        from .options import check_positive_int
        from .shortlist import VocabShortlist

        n = check_positive_int(option("drafter_shortlist"), "--drafter-shortlist")
        shortlist = VocabShortlist(task.source_dictionary, task.target_dictionary, n)
    # the drafter's engine runs on the verifier's threads
    threads = engine_threads(parse_threads(option("native_threads")))
    return NARBlockDrafter(drafter_model, task.target_dictionary, k, engine=engine, shortlist=shortlist,
                           threads=threads, isa=check_isa(option("native_isa")))


def build_aggressive_generator(task, models, args, decoding: str, option: Callable[[str], object], **kwargs):
    """The generator of an aggressive ``decoding`` (not ``beam``) for ``fairseq-generate``'s ``args``."""
    if decoding not in DECODINGS:
        raise ValueError(f"unknown --decoding {decoding!r}; choose from {', '.join(DECODINGS)}")
    check_generation_args(args, decoding)
    if kwargs.get("prefix_allowed_tokens_fn") is not None:
        raise ValueError(f"prefix_allowed_tokens_fn is not supported with --decoding {decoding}")
    from .generator import AggressiveGenerator

    drafter, acceptance = build_drafter_and_rule(decoding, task, models, option)
    generator = AggressiveGenerator(
        models,
        task.target_dictionary,
        drafter,
        acceptance=acceptance,
        max_len_a=getattr(args, "max_len_a", 0),
        max_len_b=getattr(args, "max_len_b", 200),
        min_len=getattr(args, "min_len", 1),
        normalize_scores=not getattr(args, "unnormalized", False),
        len_penalty=getattr(args, "lenpen", 1),
        unk_penalty=getattr(args, "unkpen", 0),
        temperature=getattr(args, "temperature", 1.0),
        max_draft_len=option("max_draft_len"),
        engine=str(option("engine")),
        shortlist=_shortlist(task, option("vocab_shortlist")),
        draft_cost=option("draft_cost"),
        native_threads=option("native_threads"),
        native_isa=option("native_isa"),
        native_share=kwargs.get("native_share"),
        engine_loop=not option("python_loop"),
    )
    atexit.register(_log_summary, generator, decoding)
    return generator


def _shortlist(task, n):
    if n is None:
        return None
    from .shortlist import VocabShortlist

    return VocabShortlist(task.source_dictionary, task.target_dictionary, n)


def _log_summary(generator, decoding):
    if generator.stats.sentences:
        logger.info(f"aggressive decoding ({decoding}): {generator.stats.summary()}")


def check_task_options(cfg) -> None:
    """Every decoding option of the task's configuration, at task creation."""
    check_max_draft_len(cfg.max_draft_len)
    check_iad_branches(cfg.iad_branches)
    if cfg.draft_cost not in (None, "off", "auto"):
        check_draft_cost(cfg.draft_cost)
    check_block_size(cfg.block_size)
    parse_threads(cfg.native_threads)
    check_isa(cfg.native_isa)
    check_shortlist(cfg.vocab_shortlist, str(cfg.decoding))
    build_acceptance(cfg.gad_beta, cfg.gad_tau)
    build_blockwise_acceptance(cfg.blockwise_topk, cfg.min_block_size)
