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

    def update(self, sent: int, output: List[int], n_draft: int, n_match: int) -> None:
        """``output`` now holds the emitted tokens after a pass in which
        ``n_match`` of ``n_draft`` drafted tokens were accepted."""
