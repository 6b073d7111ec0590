"""Which engine runs a model: the compiled native engine or torch, for the
verifier and for GAD's block drafter, by one policy (:func:`choose_engine`)."""
import logging
from typing import Callable, Optional, TypeVar

from .constants import ENGINES

logger = logging.getLogger("fairseq_aggressive")
T = TypeVar("T")


def choose_engine(engine: str, build_native: Callable[[], T], what: str, flag: str = "--engine") -> Optional[T]:
    """``engine`` is ``torch``: None.  ``native``: ``build_native()``, or a
    ValueError saying why it cannot run.  ``auto``: ``build_native()`` where it
    runs, else None (logged).  ``build_native`` raises
    :class:`~fairseq_aggressive.native.NativeUnavailable` where it cannot run."""
    if engine not in ENGINES:
        raise ValueError(f"{flag} must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "torch":
        return None
    from .native import NativeUnavailable

    try:
        return build_native()
    except NativeUnavailable as e:
        if engine == "native":
            raise ValueError(f"{flag} native: {e}") from e
        if e.setup:  # the engine is missing here: say so once, loudly
            _warn_once(f"the native engine cannot run: {e}. Decoding continues on the torch path "
                       f"(the same output, several times slower); --engine torch silences this")
        logger.info(f"{what}: torch ({e})")
        return None


_warned = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def build_verifier(engine: str, model, tgt_dict, acceptance, rules, wants_pass_features: bool = False,
                   shortlist=None, threads: Optional[int] = None, isa: Optional[str] = None, share=None):
    """The verifier of ``model``: a :class:`~fairseq_aggressive.verifiers.NativeVerifier`
    where the engine runs (a CPU model it supports, an acceptance rule it applies
    itself, a drafter that does not read whole passes' features, a CPU it was
    built for), else a :class:`~fairseq_aggressive.verifiers.TorchVerifier`.
    ``threads``: the engine's (None: :func:`~fairseq_aggressive.runtime.threads.engine_threads`);
    ``isa``: its build target (None / ``auto``: ``$FAIRSEQ_AGGRESSIVE_ISA`` or the best this CPU runs);
    ``share``: a :class:`~fairseq_aggressive.native.NativeEngine` made from
    ``model`` whose weights the verifier's engine reads (one copy in memory for
    generators that decode on separate threads)."""
    from .verifiers import NativeVerifier, TorchVerifier

    def native():
        from .native import NativeEngine, NativeUnavailable

        if next(model.parameters()).device.type != "cpu":
            raise NativeUnavailable("the model is not on the CPU")
        if acceptance.params.native is None:
            raise NativeUnavailable(f"the native engine does not apply {acceptance!r}")
        if wants_pass_features:
            raise NativeUnavailable("the drafter reads the verifier's decoder features of whole passes")
        if share is not None:
            if not share.runs(model):
                raise ValueError("the engine to share weights with was made from another model")
            if isa not in (None, "auto", share.isa):
                raise ValueError(f"the engine to share weights with runs {share.isa}, not {isa}")
            eng = share.share(threads)
        else:  # the weights of the model's last engine, if it is unchanged since
            eng = NativeEngine.for_model(model, tgt_dict, isa=isa, threads=threads)
        logger.info(f"verifier: the native engine ({eng.isa}, {eng.threads} thread(s); "
                    f"{eng.int8_linears} int8 linear layers, "
                    f"{eng.half_linears} stored as float16, their values are float16 values)")
        return NativeVerifier(eng, model, rules, acceptance, shortlist)

    return choose_engine(engine, native, "verifier") or TorchVerifier(model, rules, acceptance, shortlist)


def drafter_engine(engine: str) -> str:
    """The engine option of GAD's drafter for the verifier's ``--engine``: torch
    with torch, otherwise native where it runs (``auto``)."""
    return "torch" if engine == "torch" else "auto"


def build_block_drafter_engine(engine: str, model, tgt_dict, threads: Optional[int] = None,
                               isa: Optional[str] = None):
    """The native engine of GAD's block drafter ``model``
    (:class:`~fairseq_aggressive.native.block_drafter.NativeBlockDrafter`), or
    None for its torch path."""
    if not hasattr(model.decoder, "mask_embed"):  # a stand-in drafter without the block decoder
        return None

    def native():
        from .native.block_drafter import NativeBlockDrafter

        drafter = NativeBlockDrafter(model, tgt_dict, threads, isa)
        logger.info(f"drafter: the native engine ({'causal prefix, cached' if drafter.causal else 'whole rows'})")
        return drafter

    return choose_engine(engine, native, "drafter", flag="drafter engine")
