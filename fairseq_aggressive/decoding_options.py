"""What ``--decoding`` and its options mean, read and checked once.

:meth:`DecodingOptions.read` takes every decoding option through one
``option(name)`` callable (the task's: per-call generation arguments of the hub
API win over the task configuration), checks each with the functions of
:mod:`fairseq_aggressive.options` (their messages name the flags) and returns a
frozen description; :mod:`fairseq_aggressive.decoding` builds the drafter,
the acceptance rule and the generator from it.  The task reads its
configuration this way when it is created, so a bad value stops
``fairseq-train`` and ``fairseq-generate`` before anything loads."""
from dataclasses import dataclass
from typing import Callable, Optional

from .acceptance import build_acceptance, build_blockwise_acceptance
from .constants import ENGINES, PRECISIONS
from .drafters import DECODINGS
from .options import (check_block_size, check_confidence, check_draft_cost, check_iad_branches, check_isa,
                      check_max_draft_len, check_positive_int, check_shortlist)
from .runtime.threads import parse_threads


@dataclass(frozen=True)
class DecodingOptions:
    """The decoding options of ``tasks/config.py``, checked: ``decoding`` (``beam``
    or an aggressive decoding), ``engine``, ``max_draft_len`` (None: the
    engine's default), IAD's ``iad_ngram_min/max`` and ``iad_branches``,
    ``draft_cost`` (None: the default, ``off``, ``auto`` or ``FIXED,PER_POSITION``: :func:`~fairseq_aggressive.draft_policy.build_draft_policy`), GAD's
    ``drafter_path``, ``block_size``, ``drafter_bf16``, ``drafter_precision``, ``drafter_shortlist``,
    the feature drafter's ``draft_confidence``,
    ``gad_beta``/``gad_tau``, blockwise ``blockwise_topk``/``min_block_size``,
    ``native_threads`` (None: auto), ``native_isa`` (None: auto),
    ``vocab_shortlist``, ``python_loop``."""

    decoding: str = "beam"
    engine: str = "auto"
    max_draft_len: Optional[int] = None
    iad_ngram_min: int = 1
    iad_ngram_max: int = 4
    iad_branches: int = 1
    draft_cost: Optional[str] = None
    drafter_path: Optional[str] = None
    block_size: Optional[int] = None
    drafter_bf16: str = "off"
    drafter_precision: str = "float32"
    draft_confidence: float = 0.0
    drafter_shortlist: Optional[int] = None
    gad_beta: int = 1
    gad_tau: float = 0.0
    blockwise_topk: int = 1
    min_block_size: int = 1
    native_threads: Optional[int] = None
    native_isa: Optional[str] = None
    vocab_shortlist: Optional[int] = None
    python_loop: bool = False

    @property
    def aggressive(self) -> bool:
        """Whether the decoding is aggressive (not fairseq's own beam search)."""
        return self.decoding != "beam"

    @classmethod
    def read(cls, option: Callable[[str], object]) -> "DecodingOptions":
        """Every option through ``option(name)`` (None: its default), checked."""
        def get(name, default=None):
            value = option(name)
            return default if value is None else value

        decoding = str(get("decoding", "beam"))
        if decoding != "beam" and decoding not in DECODINGS:
            raise ValueError(f"unknown --decoding {decoding!r}; choose from beam, {', '.join(DECODINGS)}")
        engine = str(get("engine", "auto"))
        if engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        lo, hi = get("iad_ngram_min", 1), get("iad_ngram_max", 4)
        if lo < 1 or hi < lo:
            raise ValueError(f"--iad-ngram-min/--iad-ngram-max must satisfy 1 <= min <= max, got {lo}..{hi}")
        draft_cost = option("draft_cost")
        if draft_cost not in (None, "off", "auto"):
            check_draft_cost(draft_cost)
        drafter_precision = str(get("drafter_precision", "float32"))
        if drafter_precision not in PRECISIONS:
            raise ValueError(f"--drafter-precision must be one of {', '.join(PRECISIONS)}, got {drafter_precision!r}")
        if drafter_precision == "int8" and str(get("drafter_bf16", "off")) == "on":
            raise ValueError("--drafter-precision int8 and --drafter-bf16 on: choose one precision for the drafter")
        drafter_shortlist = option("drafter_shortlist")
        if drafter_shortlist is not None:
            drafter_shortlist = check_positive_int(drafter_shortlist, "--drafter-shortlist")
        beta, tau = get("gad_beta", 1), option("gad_tau")
        if tau is None:
            if beta is not None and int(beta) > 1:
                raise ValueError(f"--gad-beta {beta} needs --gad-tau: the GAD paper's base settings are "
                                 "--gad-beta 3 --gad-tau 1.0 (high quality) and --gad-beta 5 --gad-tau 3.0 "
                                 "(high efficiency), tuned per direction (Ge et al. 2022, Table 14)")
            tau = 0.0
        build_acceptance(beta, tau)  # the rules check their own parameters
        topk, min_block = get("blockwise_topk", 1), get("min_block_size", 1)
        build_blockwise_acceptance(topk, min_block)
        return cls(
            decoding=decoding,
            engine=engine,
            max_draft_len=check_max_draft_len(option("max_draft_len")),
            iad_ngram_min=int(lo),
            iad_ngram_max=int(hi),
            iad_branches=check_iad_branches(get("iad_branches", 1)),
            draft_cost=draft_cost,
            drafter_path=option("drafter_path"),
            block_size=check_block_size(option("block_size")),
            drafter_bf16=str(get("drafter_bf16", "off")),
            drafter_precision=drafter_precision,
            draft_confidence=check_confidence(get("draft_confidence", 0.0)),
            drafter_shortlist=drafter_shortlist,
            gad_beta=beta,
            gad_tau=tau,
            blockwise_topk=topk,
            min_block_size=min_block,
            native_threads=parse_threads(option("native_threads")),
            native_isa=check_isa(option("native_isa")),
            vocab_shortlist=check_shortlist(option("vocab_shortlist"), decoding),
            python_loop=bool(get("python_loop", False)),
        )
