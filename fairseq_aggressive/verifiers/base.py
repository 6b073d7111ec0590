"""The verifier contract: the AR model scores ``[last token] + draft`` for
every sentence of a batch in one pass, chooses tokens under fairseq's score
rules and an acceptance rule, and keeps in its cache only what was emitted.

Both engines implement it: :class:`~fairseq_aggressive.verifiers.TorchVerifier`
(the model's own modules, any device) and
:class:`~fairseq_aggressive.verifiers.NativeVerifier` (the compiled CPU engine).
The generator's loop talks to this contract only.
"""
import contextlib
from dataclasses import dataclass
from typing import List, Optional, Sequence

from torch import Tensor

from ..constants import DEFAULT_MAX_DRAFT_LEN


@dataclass(frozen=True)
class ScoreRules:
    """fairseq's ``SequenceGenerator`` score rules at ``--beam 1``, which every
    engine applies before choosing a token: pad is never chosen, ``unk`` loses
    ``unk_penalty``, only EOS may follow at the length cap, EOS may not come
    before ``min_len`` tokens; logits are divided by ``temperature``; where
    ``forced`` is a token, every output starts with it (fairseq's prefix token,
    transformers' ``forced_bos_token_id``: at output position 0 nothing else is
    chosen or accepted).  The reported score is the log-probability under the
    unadjusted distribution."""

    pad: int
    unk: int
    eos: int
    min_len: int = 1
    unk_penalty: float = 0.0
    temperature: float = 1.0
    forced: Optional[int] = None


@dataclass
class PassResult:
    """One pass, per row of the pass (``sents[i]``'s row is row ``i``).

    ``emit[i]``: the accepted drafted tokens and the verifier's own token after
    them, cut after the first EOS; ``scores[i]``: their log-probabilities;
    ``n_match[i]``: drafted tokens accepted (of the kept branch); ``done[i]``:
    EOS was emitted; ``kept[i]``: which of the row's branches was kept (0
    without branches).  ``emitted_features`` (sum(n_emit) x C), when asked for:
    the decoder features (last layer, normalised) each emitted token was
    chosen from, the rows one after the other; ``pass_features`` (B x W x C),
    when asked for: the features of every position of the pass."""

    emit: List[List[int]]
    scores: List[List[float]]
    n_match: List[int]
    done: List[bool]
    kept: List[int]
    emitted_features: Optional[Tensor] = None
    pass_features: Optional[Tensor] = None


class Verifier:
    """Scores drafts with the AR model (see the module docstring).

    A batch starts with :meth:`begin`; then every :meth:`step` verifies one
    row per sentence still being decoded.  Sentences are named by their index
    in the batch; a sentence missing from ``sents`` has finished for good and
    its cache may be freed.
    """

    #: a short name for logs and benchmarks
    name = "verifier"
    #: the native engine the verifier runs on (None: torch)
    engine = None
    #: whether it can verify several branches of a sentence in one pass
    branch_capable = False
    #: the draft cap it prefers for drafters whose drafts have no natural length (None: none)
    open_draft_cap = DEFAULT_MAX_DRAFT_LEN["torch"]
    #: fairseq's score rules (:class:`ScoreRules`) and the acceptance rule it applies
    rules: ScoreRules
    acceptance = None

    def begin(self, sample, max_len: int, tree_room: int = 0) -> None:
        """Encode the batch of ``sample`` (a fairseq sample dict) for outputs of
        up to ``max_len`` tokens; ``tree_room``: extra cache positions a pass over
        several branches may use."""
        raise NotImplementedError

    @property
    def takes_branches(self) -> bool:
        """Whether :meth:`step` verifies several branches of a row in one pass
        (for the batch begun last); otherwise it takes one draft per row."""
        return False

    def encoder_out(self):
        """The batch's encoder output as fairseq's encoder returns it (for a
        drafter that shares the verifier's encoder)."""
        raise NotImplementedError

    @property
    def runs_engine_loops(self) -> bool:
        """Whether :meth:`decode_in_engine` runs a drafter's whole decoding
        loop for the batch begun last (inside the verifier's engine)."""
        return False

    def decode_in_engine(self, kind: str, first: int, max_draft, budget: bool = False, copy=None, drafter=None,
                         **settings):
        """(:attr:`runs_engine_loops`) The batch begun last, decoded whole by
        the engine's loop inside this verifier with the engine's drafter
        ``kind`` (``native.c_api.DRAFTERS``), one call for the batch: rows start
        from the token ``first``; drafts of at most ``max_draft`` tokens (None:
        no cap), with ``budget`` in the lengths the engine's draft-length policy
        chooses; ``copy``: (tokens, lengths) of each sentence's copy source in
        target ids; ``drafter``: (engine, state) of a drafter with a decoder of
        its own; ``settings``: the drafter's other settings
        (:func:`~fairseq_aggressive.native.running.run_settings`).  Returns per
        sentence its tokens, their scores and passes, and the loop's counters
        (a :class:`~fairseq_aggressive.native.c_api.RunStats`).  The drafter
        chooses the loop's drafter
        (:meth:`~fairseq_aggressive.drafters.base.Drafter.decode_in_engine`);
        the verifier applies its score rules and acceptance."""
        raise NotImplementedError(f"{type(self).__name__} does not run decoding loops itself")

    def step(self, sents: Sequence[int], rows: Sequence[List[int]], branches: Optional[Sequence[List[int]]] = None,
             emitted_features: bool = False, pass_features: bool = False) -> PassResult:
        """Verify ``rows[i]`` = [last token] + draft of sentence ``sents[i]``.
        ``branches[i]``, where :attr:`takes_branches`: the lengths of the drafts
        that follow the last token one after the other (each continues the last
        token; the pass keeps the one that accepts most)."""
        raise NotImplementedError

    def running(self):
        """A context the generator decodes a batch in (the engine's thread setup)."""
        return contextlib.nullcontext()

    def pass_cost(self, src_tokens):
        """A measured :class:`~fairseq_aggressive.draft_budget.PassCost` of this
        verifier's passes over ``src_tokens`` (verifiers that take branches)."""
        raise NotImplementedError(f"{type(self).__name__} has no measured pass cost")
