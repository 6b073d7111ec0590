"""How many drafted positions each pass verifies: a draft-length policy the
generator's loop consults (as vLLM's speculative decoding hands its loop a
proposer-length policy).

:class:`FixedDrafts` verifies the drafts as the drafter made them (capped by
``--max-draft-len``); :class:`EngineBudget` hands the choice to the native
engine's loop, which keeps per pass and per row the positions that pay for
themselves under the pass cost it measures, against the acceptance it learns
(``csrc/loop/draft_lengths.h``: a lone sentence drafts long, a full batch falls
back toward greedy); :class:`BudgetedDrafts` keeps, per pass, the positions
that pay for themselves under a pass cost (``--draft-cost``,
:mod:`fairseq_aggressive.draft_budget`), may skip the drafter on a pass, and
learns the cost from the loop's own iterations.  :func:`build_draft_policy`
chooses one.  Only lengths change: the verifier decides what is accepted."""
import logging
import time
from typing import List, Optional

from .constants import DEFAULT_MAX_DRAFT_LEN
from .draft_budget import DraftBudget, PassCost

logger = logging.getLogger("fairseq_aggressive")

# when the budget skips the drafter, one pass in this many drafts anyway (the cost is learnt from them)
BUDGET_EXPLORE = 16


class FixedDrafts:
    """The drafts as proposed: every branch verified whole (up to the cap)."""

    #: whether a verifier's own loop (which makes whole drafts) may run the batch
    whole_drafts = True
    #: whether that loop chooses each pass's lengths by the engine's policy
    engine_budget = False

    def default_cap(self, verifier) -> Optional[int]:
        """The draft cap of open-ended drafters when ``--max-draft-len`` is unset."""
        return verifier.open_draft_cap

    def begin(self, verifier, src_tokens, several: bool) -> None:
        """A batch the verifier has begun (``several``: it takes branches)."""

    def skips_drafter(self, n_rows: int, drafter, longest: int, several: bool) -> bool:
        """Whether this pass runs without the drafter (greedy's single token)."""
        return False

    def lengths(self, cands, n_rows: int, t_start: float, several: bool) -> List[List[int]]:
        """The length to verify of every branch of every row (0: drop it);
        ``t_start``: when the drafter was asked (perf_counter)."""
        return [[len(br.tokens) for br in c] for c in cands]

    def observe_pass(self, positions: int, seconds: float, several: bool) -> None:
        """The loop's whole iteration over ``positions`` positions took ``seconds``."""


class EngineBudget(FixedDrafts):
    """The lengths each pass of the engine's own loop chooses
    (:meth:`~fairseq_aggressive.native.NativeBatch.decode` with
    ``budget``); where that loop does not run a batch (a batch the engine
    cannot take goes to torch), the drafts as made."""

    engine_budget = True

    def default_cap(self, verifier) -> Optional[int]:
        return DEFAULT_MAX_DRAFT_LEN["engine"]


class BudgetedDrafts(FixedDrafts):
    """Cost-aware lengths: a :class:`~fairseq_aggressive.draft_budget.DraftBudget`
    under a given pass cost, or one measured on the first batch (``measure``)
    and then fitted to the loop's iterations, Python included."""

    whole_drafts = False

    def __init__(self, cost: PassCost, measure: bool):
        self.budget = DraftBudget(cost)
        self._measure = measure  # on the first batch
        self._skipped = 0  # passes in a row that skipped the drafter

    def default_cap(self, verifier) -> Optional[int]:
        return DEFAULT_MAX_DRAFT_LEN["budget"]

    def begin(self, verifier, src_tokens, several: bool) -> None:
        if self._measure and several:
            self.budget.reset(verifier.pass_cost(src_tokens))
            self._measure = False
            logger.info(f"draft budget: a pass costs {self.budget.cost}")

    def skips_drafter(self, n_rows: int, drafter, longest: int, several: bool) -> bool:
        # drafts that cannot pay for the drafter and their positions: greedy's pass without the
        # drafter (its update() sees nothing verified and re-anchors later from the output); every
        # BUDGET_EXPLORE-th pass in a row drafts anyway, so that the cost keeps being learnt
        if several and self._skipped < BUDGET_EXPLORE - 1 and not self.budget.pays(n_rows,
                                                                                   drafter.best_gains(longest)):
            self._skipped += 1
            return True
        self._skipped = 0
        return False

    def lengths(self, cands, n_rows: int, t_start: float, several: bool) -> List[List[int]]:
        lengths = self.budget.select(cands)
        if several and self.budget.cost.measured:  # what asking the drafter costs per row
            self.budget.observe_drafter(n_rows, time.perf_counter() - t_start)
        return lengths

    def observe_pass(self, positions: int, seconds: float, several: bool) -> None:
        if several and self.budget.cost.measured:
            self.budget.observe(positions, seconds)


def build_draft_policy(draft_cost: Optional[str], verifier, drafter, engine_loop: bool = True):
    """``--draft-cost``: unset (None) or ``auto``: the engine's own budget
    where the native engine runs the drafter's loop itself (IAD with one
    branch), else fixed lengths (unset) or a budget whose cost is measured on
    the first batch (``auto``); ``off`` fixed lengths; ``FIXED,PER_POSITION`` a
    given cost for the generator's loop (a bad value is an error even where no
    budget applies).  A budget in the generator's loop needs a verifier that
    takes branches and a drafter whose branches carry gains.  ``engine_loop``:
    whether the generator lets the engine run its loop (``--python-loop``: no)."""
    if draft_cost == "off":
        return FixedDrafts()
    if (draft_cost in (None, "auto") and engine_loop and getattr(verifier, "runs_engine_loops", False)
            and drafter.engine_budget()):
        return EngineBudget()
    if draft_cost is None:
        return FixedDrafts()
    cost = PassCost(1.0, 1.0) if draft_cost == "auto" else PassCost.parse(draft_cost)
    if verifier.branch_capable and drafter.caps.branches:
        return BudgetedDrafts(cost, measure=draft_cost == "auto")
    return FixedDrafts()
