"""What ``--decoding`` builds: the drafter and acceptance rule of each
aggressive decoding and the :class:`AggressiveGenerator` around them, from a
:class:`~fairseq_aggressive.decoding_options.DecodingOptions` (read and
checked once by the task)."""
import atexit
import logging

import torch

from .acceptance import build_acceptance, build_blockwise_acceptance
from .runtime.cpu_features import use_bf16
from .decoding_options import DecodingOptions
from .draft_policy import build_draft_policy
from .engines import build_verifier, drafter_engine
from .options import check_generation_args, check_single_model, check_temperature
from .runtime.threads import engine_threads
from .verifiers import ScoreRules

logger = logging.getLogger("fairseq_aggressive")


def build_drafter_and_rule(opts: DecodingOptions, task, models):
    """(drafter, acceptance rule) of the aggressive decoding ``opts.decoding``."""
    if opts.decoding == "iad":
        from .drafters import InputCopyDrafter

        drafter = InputCopyDrafter(task.source_dictionary, task.target_dictionary, ngram_min=opts.iad_ngram_min,
                                   ngram_max=opts.iad_ngram_max, branches=opts.iad_branches)
        return drafter, build_acceptance()
    if opts.decoding == "blockwise":
        from .drafters import BlockwiseHeadsDrafter

        drafter = BlockwiseHeadsDrafter(models[0], task.target_dictionary)
        rule = build_blockwise_acceptance(opts.blockwise_topk, opts.min_block_size, block_size=models[0].blockwise_k)
        return drafter, rule
    if opts.decoding == "gad":
        return build_gad_drafter(task, models, opts), build_acceptance(opts.gad_beta, opts.gad_tau)
    raise ValueError(f"--decoding {opts.decoding} has no drafter (it is fairseq's own search)")


def build_gad_drafter(task, models, opts: DecodingOptions):
    """GAD's NAR block drafter from ``--drafter-path``, checked against the verifier."""
    from .drafters import NARBlockDrafter, check_drafter

    if not opts.drafter_path:
        raise ValueError("--decoding gad needs a drafter: pass --drafter-path DRAFTER.pt")
    dtype = torch.bfloat16 if use_bf16(opts.drafter_bf16, "--drafter-bf16") else None
    drafter_model, trained_k = task.load_drafter(opts.drafter_path, like=models[0], dtype=dtype)
    check_drafter(drafter_model, models[0], task.target_dictionary)
    k = opts.block_size
    if k is None:
        k = trained_k or 25
    shortlist = None
    if opts.drafter_shortlist is not None:
        from .shortlist import VocabShortlist

        shortlist = VocabShortlist(task.source_dictionary, task.target_dictionary, opts.drafter_shortlist)
    # the drafter's engine runs on the verifier's threads
    return NARBlockDrafter(drafter_model, task.target_dictionary, k, engine=drafter_engine(opts.engine),
                           shortlist=shortlist, threads=engine_threads(opts.native_threads), isa=opts.native_isa)


def build_aggressive_generator(task, models, args, opts: DecodingOptions, **kwargs):
    """The generator of an aggressive decoding (``opts``) for ``fairseq-generate``'s ``args``."""
    if not opts.aggressive:
        raise ValueError("--decoding beam is fairseq's own generator")
    check_generation_args(args, opts.decoding)
    if kwargs.get("prefix_allowed_tokens_fn") is not None:
        raise ValueError(f"prefix_allowed_tokens_fn is not supported with --decoding {opts.decoding}")
    from .generator import AggressiveGenerator

    tgt_dict = task.target_dictionary
    check_single_model(models)
    temperature = check_temperature(getattr(args, "temperature", 1.0))
    drafter, acceptance = build_drafter_and_rule(opts, task, models)
    rules = ScoreRules(tgt_dict.pad(), tgt_dict.unk(), tgt_dict.eos(), getattr(args, "min_len", 1),
                       getattr(args, "unkpen", 0), temperature)
    # the engine is chosen here, once, for the verifier (and, above, for GAD's drafter)
    verifier = build_verifier(opts.engine, models[0], tgt_dict, acceptance, rules,
                              wants_pass_features=drafter.caps.pass_features,
                              shortlist=_shortlist(task, opts.vocab_shortlist), threads=opts.native_threads,
                              isa=opts.native_isa, share=kwargs.get("native_share"))
    generator = AggressiveGenerator(
        models,
        tgt_dict,
        drafter,
        max_len_a=getattr(args, "max_len_a", 0),
        max_len_b=getattr(args, "max_len_b", 200),
        normalize_scores=not getattr(args, "unnormalized", False),
        len_penalty=getattr(args, "lenpen", 1),
        max_draft_len=opts.max_draft_len,
        engine_loop=not opts.python_loop,
        verifier=verifier,
        draft_policy=build_draft_policy(opts.draft_cost, verifier, drafter),
    )
    atexit.register(_log_summary, generator, opts.decoding)
    return generator


def _shortlist(task, n):
    if n is None:
        return None
    from .shortlist import VocabShortlist

    return VocabShortlist(task.source_dictionary, task.target_dictionary, n)


def _log_summary(generator, decoding):
    if generator.stats.sentences:
        logger.info(f"aggressive decoding ({decoding}): {generator.stats.summary()}")


def check_task_options(cfg) -> DecodingOptions:
    """Every decoding option of the task's configuration, at task creation."""
    return DecodingOptions.read(lambda name: getattr(cfg, name, None))
