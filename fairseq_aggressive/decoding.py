"""What ``--decoding`` builds: the drafter and acceptance rule of each
aggressive decoding and the :class:`AggressiveGenerator` around them, from a
:class:`~fairseq_aggressive.decoding_options.DecodingOptions` (read and
checked once by the task)."""
import logging
import weakref

from .constants import DEFAULT_MAX_DRAFT_LEN
from .decoding_options import DecodingOptions
from .models.hf_transformer import forced_first
from .options import check_generation_args, check_single_model, check_temperature

logger = logging.getLogger("fairseq_aggressive")


def build_drafter_and_rule(opts: DecodingOptions, task, models):
    """(drafter, acceptance rule) of the aggressive decoding ``opts.decoding``
    (its builder in :data:`~fairseq_aggressive.drafters.DECODINGS`)."""
    from .drafters import DECODINGS

    if opts.decoding not in DECODINGS:
        raise ValueError(f"--decoding {opts.decoding} has no drafter (it is fairseq's own search)")
    return DECODINGS[opts.decoding](opts, task, models)




def build_aggressive_generator(task, models, args, opts: DecodingOptions, **kwargs):
    """The generator of an aggressive decoding (``opts``) for ``fairseq-generate``'s ``args``."""
    if not opts.aggressive:
        raise ValueError("--decoding beam is fairseq's own generator")
    if opts.decoding == "iad" and getattr(args, "beam", 5) != 1:
        return build_drafted_beam(task, models, args, opts)
    check_generation_args(args, opts.decoding)
    if kwargs.get("prefix_allowed_tokens_fn") is not None:
        raise ValueError(f"prefix_allowed_tokens_fn is not supported with --decoding {opts.decoding}")
    from .generator import build_generator

    check_single_model(models)
    check_temperature(getattr(args, "temperature", 1.0))  # before a drafter loads
    drafter, acceptance = build_drafter_and_rule(opts, task, models)
    # the engine is chosen there, once, for the verifier (and, above, for GAD's drafter)
    generator = build_generator(
        models, task.target_dictionary, drafter, acceptance,
        min_len=getattr(args, "min_len", 1), unk_penalty=getattr(args, "unkpen", 0),
        temperature=getattr(args, "temperature", 1.0), engine=opts.engine,
        shortlist=_shortlist(task, opts.vocab_shortlist), draft_cost=opts.draft_cost,
        native_threads=opts.native_threads, native_isa=opts.native_isa, native_share=kwargs.get("native_share"),
        engine_loop=not opts.python_loop,
        max_len_a=getattr(args, "max_len_a", 0),
        max_len_b=getattr(args, "max_len_b", 200),
        normalize_scores=not getattr(args, "unnormalized", False),
        len_penalty=getattr(args, "lenpen", 1),
        max_draft_len=opts.max_draft_len, forced_first=forced_first(models[0]),
    )
    # its summary once it is gone or at exit (a reference held to the end would keep
    # every generator of a hub model's translate() calls, with its engine and threads)
    weakref.finalize(generator, _log_summary, generator.stats, opts.decoding)
    return generator


def build_drafted_beam(task, models, args, opts: DecodingOptions):
    """``--decoding iad --beam N``: the engine's beam search (fairseq's
    ``SequenceGenerator`` with ``BeamSearch``, the same output) with its best
    hypothesis drafted from the source (native/beam.py); fairseq's own beam
    search, logged once, where the engine does not run and ``--engine`` is ``auto``."""
    from fairseq.tasks.translation import TranslationTask

    from .engines import choose_engine
    from .native.beam import CopyDrafts, native_beam_from

    for flag, given in (("--vocab-shortlist", opts.vocab_shortlist is not None), ("--python-loop", opts.python_loop),
                        (f"--iad-branches {opts.iad_branches}", opts.iad_branches != 1)):
        if given:
            raise ValueError(f"{flag} is not supported with --decoding iad --beam N (drafted beam search)")
    if opts.engine == "torch":
        raise ValueError("--decoding iad with --beam N > 1 (drafted beam search) runs in the native engine: "
                         "--engine native or auto, or --decoding beam for fairseq's own beam search")
    fallback = TranslationTask.build_generator(task, models, args)
    drafter, _ = build_drafter_and_rule(opts, task, models)
    max_draft = DEFAULT_MAX_DRAFT_LEN["beam"] if opts.max_draft_len is None else opts.max_draft_len
    drafts = CopyDrafts(drafter.copy_source, max_draft, opts.iad_ngram_min, opts.iad_ngram_max)
    built = choose_engine(opts.engine, lambda: native_beam_from(fallback, models, task.target_dictionary,
                                                                threads=opts.native_threads, isa=opts.native_isa,
                                                                drafts=drafts), "drafted beam search")
    return fallback if built is None else built


def _shortlist(task, n):
    if n is None:
        return None
    from .shortlist import VocabShortlist

    return VocabShortlist(task.source_dictionary, task.target_dictionary, n)


def _log_summary(stats, decoding):
    if stats.sentences:
        logger.info(f"aggressive decoding ({decoding}): {stats.summary()}")


def check_task_options(cfg) -> DecodingOptions:
    """Every decoding option of the task's configuration, at task creation."""
    return DecodingOptions.read(lambda name: getattr(cfg, name, None))
