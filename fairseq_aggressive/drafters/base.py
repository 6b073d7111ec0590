"""The drafter interface of the aggressive generator."""
from typing import List


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
    # drafters that read the verifier's encoder output in begin() set this
    needs_encoder_out = False
    # drafters whose drafts have no natural length (IAD: the rest of the source)
    # set this; the generator then applies a default cap with the native engine
    open_ended = False
    # the longest output of the batch being decoded (set by the generator before begin())
    batch_max_len = None

    def observe(self, sents: List[int], feats, n_emit) -> None:
        """Called after each pass with the verifier's features (B, W, C) of the
        sentences ``sents`` and the number of tokens each emitted."""

    def update(self, sent: int, output: List[int], n_draft: int, n_match: int) -> None:
        """``output`` now holds the emitted tokens after a pass in which
        ``n_match`` of ``n_draft`` drafted tokens were accepted."""
