"""The drafter interface of the aggressive generator."""
from dataclasses import dataclass
from typing import List, Optional


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


class Drafter:
    """Proposes tokens that the verifier checks in one pass.

    Sentences are identified by their index in the batch given to :meth:`begin`;
    the generator only asks about sentences that are still being decoded.
    """

    def begin(self, sample, encoder_out=None) -> None:
        """Start a new batch (``sample`` is a fairseq sample dict)."""
        raise NotImplementedError

    def propose(self, sent: int, output: List[int], cap: int) -> List[int]:
        """Up to ``cap`` tokens to follow ``output`` for sentence ``sent``."""
        raise NotImplementedError

    def propose_batch(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[int]]:
        """:meth:`propose` for several sentences (drafters that run a model
        override this to draft the whole batch in one call)."""
        return [self.propose(s, o, c) for s, o, c in zip(sents, outputs, caps)]

    # drafters that read the verifier's features set this and implement observe()
    wants_features = False
    # drafters that read the features each emitted token was chosen from set this and
    # implement observe_emitted() (the native engine hands these over, not whole passes)
    wants_emitted_features = False
    # drafters that read the verifier's encoder output in begin() set this
    needs_encoder_out = False
    # drafters whose drafts have no natural length (IAD: the rest of the source)
    # set this; the generator then applies a default cap with the native engine
    open_ended = False
    # the longest output of the batch being decoded (set by the generator before begin())
    batch_max_len = None

    # drafters that propose several drafts per pass (propose_branches) set this;
    # the native engine verifies them in one pass and keeps the one that accepts most
    multi_branch = False
    # the most branches propose_branches returns for one sentence
    max_branches = 1

    def propose_branches(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        """Per sentence, drafts that each continue its output (the first is the
        one a verifier that takes a single draft uses).  The generator may
        shorten a branch's ``tokens`` in place before verifying (cost-aware
        lengths); :meth:`update` then names the branch that was kept."""
        return [[Branch(d)] for d in self.propose_batch(sents, outputs, caps)]

    def best_gains(self, n: int) -> List[float]:
        """The largest gains the first ``n`` positions of a branch of
        :meth:`propose_branches` can carry (a cost-aware budget skips the
        drafter when not even these would pay for its time and positions)."""
        return [1.0] * n

    def observe(self, sents: List[int], feats, n_emit) -> None:
        """Called after each pass with the verifier's features (B, W, C) of the
        sentences ``sents`` and the number of tokens each emitted."""

    def observe_emitted(self, sents: List[int], feats, n_emit: List[int]) -> None:
        """Called after each pass with the verifier's features (last layer,
        normalised) that chose each emitted token: ``feats`` (sum of
        ``n_emit`` x C), sentence ``sents[i]``'s ``n_emit[i]`` tokens after
        those of the sentences before it."""

    def update(self, sent: int, output: List[int], n_draft: int, n_match: int, branch: int = 0) -> None:
        """``output`` now holds the emitted tokens after a pass in which
        ``n_match`` of ``n_draft`` drafted tokens of branch ``branch`` (the
        kept one, of those :meth:`propose_branches` returned) were accepted."""
