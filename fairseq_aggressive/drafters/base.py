"""The drafter contract of the aggressive generator.

A drafter proposes tokens (:meth:`Drafter.propose`) and learns what was
accepted (:meth:`Drafter.update`), as HF's ``get_candidates`` /
``update_candidate_strategy``.  What it needs from the generator and the
verifier is declared once, in :class:`DrafterCaps`.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Branch:
    """One draft of a sentence, a continuation of its last token: ``tokens``;
    ``gains``, if the drafter knows them, the expected number of accepted
    tokens each position adds (the probability that it and every token before
    it are accepted), which lets a cost-aware budget
    (:mod:`fairseq_aggressive.draft_budget`) shorten the branch; ``kind``,
    how the drafter made it."""

    tokens: List[int]
    gains: Optional[List[float]] = None
    kind: str = ""


@dataclass(frozen=True)
class DrafterCaps:
    """What a drafter needs and offers.

    ``pass_features``: it reads the verifier's decoder features of every
    position of a pass (:meth:`Drafter.observe`; torch verifier only).
    ``emitted_features``: it reads the features each emitted token was chosen
    from (:meth:`Drafter.observe_emitted`; both engines).  ``encoder_out``: its
    :meth:`Drafter.begin` takes the verifier's encoder output.  ``open_ended``:
    its drafts have no natural length (IAD: the rest of the source); the
    generator caps them by default on the native engine.  ``branches``: it
    proposes drafts with gains, several per sentence up to ``max_branches``
    (a verifier that takes branches keeps the one that accepts most; a
    cost-aware budget may shorten them)."""

    pass_features: bool = False
    emitted_features: bool = False
    encoder_out: bool = False
    open_ended: bool = False
    branches: bool = False
    max_branches: int = 1


@dataclass(frozen=True)
class DraftOutcome:
    """What became of a sentence's proposal in a pass: ``verified[i]``, the
    positions of branch ``i`` the verifier checked (0: it was not verified;
    a budget or a verifier that takes one draft may verify fewer than were
    proposed); ``kept``, the branch whose result was emitted; ``n_match``, its
    drafted tokens accepted."""

    verified: List[int]
    kept: int
    n_match: int

    @property
    def n_draft(self) -> int:
        """Positions of the kept branch that were verified."""
        return self.verified[self.kept] if self.verified else 0


class Drafter:
    """Proposes tokens that the verifier checks in one pass.

    Sentences are identified by their index in the batch given to :meth:`begin`;
    the generator only asks about sentences that are still being decoded.  The
    generator never changes what :meth:`propose` returned.
    """

    caps = DrafterCaps()

    def begin(self, sample, max_len: int, encoder_out=None) -> None:
        """Start a new batch (``sample``, a fairseq sample dict) whose outputs
        have at most ``max_len`` tokens; ``encoder_out``: the verifier's, for a
        drafter whose caps ask for it."""
        raise NotImplementedError

    def propose(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        """Per sentence ``sents[i]``, drafts of up to ``caps[i]`` tokens that each
        continue ``outputs[i]`` (at least one, possibly empty; the first is the
        one a verifier that takes a single draft uses)."""
        raise NotImplementedError

    def update(self, sent: int, output: List[int], outcome: DraftOutcome) -> None:
        """``output`` now holds sentence ``sent``'s emitted tokens after a pass
        that went as ``outcome`` says."""

    def best_gains(self, n: int) -> List[float]:
        """The largest gains the first ``n`` positions of a branch can carry (a
        cost-aware budget skips the drafter when not even these would pay for
        its time and positions)."""
        return [1.0] * n

    def observe(self, sents: List[int], feats, n_emit: List[int]) -> None:
        """(caps.pass_features) After each pass: the verifier's features
        (B, W, C) of the sentences ``sents`` and the number of tokens each emitted."""

    def observe_emitted(self, sents: List[int], feats, n_emit: List[int]) -> None:
        """(caps.emitted_features) After each pass: the verifier's features (last
        layer, normalised) that chose each emitted token: ``feats`` (sum of
        ``n_emit`` x C), sentence ``sents[i]``'s ``n_emit[i]`` tokens after
        those of the sentences before it."""

    def decode_in_engine(self, verifier, sample, max_len: int, first: int,
                         max_draft: Optional[int], budget: bool = False) -> Optional["LoopResult"]:
        """The batch ``sample`` (begun by ``verifier``, not by this drafter)
        decoded by a loop inside ``verifier``'s engine that makes exactly this
        drafter's drafts, one call per batch (the output and counters of the
        generator's loop), or None where no such loop runs it (the generator
        then runs its own).  ``first``: the token before the output;
        ``max_draft``: the cap on each draft (None: none); ``budget``: each
        pass's lengths chosen by the engine's draft-length policy (only a
        drafter whose :meth:`engine_budget` is true is asked for it).

        A drafter the engine has a counterpart of (``csrc/loop/*_drafter.cpp``)
        names it to ``verifier.decode_in_engine(kind, ...)`` (where
        ``verifier.runs_engine_loops``) with its settings.  Without one (this
        default), the generator's loop runs the drafter, one engine call per
        pass, and says so once (the same output)."""
        return None

    def engine_drafter(self, verifier) -> Optional["EngineDrafter"]:
        """The engine drafter that makes exactly this drafter's drafts for
        ``verifier``'s engine (an :class:`EngineDrafter`), or None (the default:
        no engine counterpart).  A running batch of the engine (streaming, the
        server) drafts with it."""
        return None

    def engine_budget(self) -> bool:
        """Whether :meth:`decode_in_engine` can choose each pass's lengths by
        the engine's draft-length policy."""
        return False


@dataclass
class EngineDrafter:
    """The engine's counterpart of a Python drafter (``csrc/loop/*_drafter.cpp``):
    its ``kind`` (its name in the engine's table, ``native.c_api.DRAFTERS``), its
    ``settings`` (:func:`~fairseq_aggressive.native.running.run_settings`' keywords),
    the ``engine`` of a drafter with a decoder of its own (or None), whether its
    rows need their sources in target ids (``copies``) and whether it drafts for
    rows that join a running batch one by one (``joins``; else only for a batch
    the drafter began itself)."""

    kind: str
    settings: Dict[str, Any] = field(default_factory=dict)
    engine: Any = None
    copies: bool = False
    joins: bool = True


@dataclass
class LoopResult:
    """A batch decoded by a loop in the verifier's engine: per sentence its
    ``tokens``, their ``scores`` and the ``passes`` it took part in, and the
    loop's counters ``stats`` (a :class:`~fairseq_aggressive.native.c_api.LoopStats`)."""

    tokens: List[List[int]]
    scores: List[List[float]]
    passes: List[int]
    stats: Any


def drafts_as(drafter: Drafter, cls: type, methods) -> bool:
    """Whether ``drafter``'s ``methods`` are ``cls``'s own, neither overridden
    by a subclass nor replaced on the instance: then a loop in the engine that
    makes ``cls``'s drafts makes this drafter's."""
    return all(getattr(getattr(drafter, m, None), "__func__", None) is getattr(cls, m) for m in methods)


def single_drafts(drafts: List[List[int]]) -> List[List[Branch]]:
    """:meth:`Drafter.propose`'s answer for drafters with one draft per sentence."""
    return [[Branch(d)] for d in drafts]
