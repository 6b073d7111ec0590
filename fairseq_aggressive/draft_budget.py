"""Cost-aware draft lengths: how many drafted positions a pass should verify.

A pass of the native engine costs about ``fixed + per_position * T`` for T
positions in all its rows (:class:`PassCost`, given with ``--draft-cost
FIXED,PER_POSITION``, or measured at start-up and then fitted to the
generator's own iterations: the line through their milliseconds against
their positions, Python included).  A drafter that knows how likely
each drafted token is to be accepted (:class:`~.drafters.base.Branch` gains)
lets :class:`DraftBudget` keep the positions that pay: positions are taken in
order of expected accepted tokens while each one adds more tokens per
millisecond than the pass already yields.  Every row emits one token per pass
whatever is drafted, so with many rows (a large batch) or a fixed cost that is
small against a position's, drafts shrink towards greedy's single token; with
one row and a large fixed cost they grow.  Only the lengths change: the
verifier decides what is accepted, so the output stays greedy's.
"""
import statistics
import time
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from .options import check_draft_cost

# the least either part of a pass's cost may be (ms); a measured cost's timings count as
# this many of the generator's iterations when the cost is learnt on from them
MIN_MS = 1e-4
CALIBRATION_WEIGHT = 4.0


@dataclass
class PassCost:
    """Milliseconds of one verification pass: ``fixed + per_position * positions``."""

    fixed: float
    per_position: float
    measured: bool = False
    # the timings a measured cost came from: (positions in the pass, ms)
    points: Tuple[Tuple[float, float], ...] = ()

    def __str__(self):
        how = "measured" if self.measured else "given"
        return f"{self.fixed:.3f} ms + {self.per_position:.3f} ms per position ({how})"

    @classmethod
    def parse(cls, text: str) -> "PassCost":
        fixed, per = check_draft_cost(text)
        return cls(fixed, per)


def measure_pass_cost(engine, src_tokens, repeats: int = 7) -> PassCost:
    """Time passes of ``engine`` over the batch ``src_tokens``: every row with 1
    and then with 5 positions (medians of ``repeats``), on a scratch state.
    The drafted tokens are padding, which greedy never chooses: every position
    is computed and projected, as the drafted positions a rejection wastes are."""
    B = src_tokens.size(0)
    times = {}
    for T in (1, 5):
        state = engine.begin(src_tokens, repeats + T + 4)
        sents = list(range(B))
        rows = [[engine.eos] + [engine.pad] * (T - 1) for _ in sents]
        samples = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            state.step(sents, rows, max_len=1 << 20, min_len=0, unk_penalty=0.0, temperature=1.0)
            samples.append(time.perf_counter() - t0)
        times[T] = statistics.median(samples[1:]) * 1000.0
    per = max((times[5] - times[1]) / (4 * B), MIN_MS)
    fixed = max(times[1] - per * B, MIN_MS)
    return PassCost(fixed, per, measured=True, points=((B, times[1]), (5 * B, times[5])))


class DraftBudget:
    """Chooses branch lengths for a pass under a :class:`PassCost`."""

    def __init__(self, cost: PassCost, max_positions: int = 64):
        self.max_positions = max_positions  # per row, a cap on the tree's size
        self.reset(cost)

    def reset(self, cost: PassCost) -> None:
        self.cost = cost
        # least-squares sums (weight, x, y, xx, xy) of ms against positions; a measured
        # cost's own timings start them, each worth CALIBRATION_WEIGHT iterations
        self._sums = [0.0] * 5
        self._draft_rows, self._draft_ms = 0, 0.0
        for x, y in cost.points:
            self._add(x, y, CALIBRATION_WEIGHT)

    def _add(self, x: float, y: float, w: float) -> None:
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] += w * v

    def observe(self, positions: int, seconds: float) -> None:
        """A measured pass (the generator's whole iteration, its Python
        included): both parts of the cost become the least-squares line of
        the iterations' milliseconds against their positions.  A bare engine
        pass over padding misses the Python each row and each drafted
        position costs, and an estimate of one part taken as exact makes the
        other absorb its error (and grow with the positions it justifies)."""
        self._add(float(positions), 1000.0 * seconds, 1.0)
        n, sx, sy, sxx, sxy = self._sums
        det = n * sxx - sx * sx
        if n < 2 or det <= 1e-9 * max(n * sxx, 1.0):  # positions have not varied yet
            return
        per = (n * sxy - sx * sy) / det
        self.cost.per_position = max(per, MIN_MS)
        self.cost.fixed = max((sy - self.cost.per_position * sx) / n, MIN_MS)

    def observe_drafter(self, n_rows: int, seconds: float) -> None:
        """The drafter's time for a pass of ``n_rows`` rows (proposing and
        choosing lengths): what drafting costs per row beyond the positions."""
        self._draft_rows += n_rows
        self._draft_ms += 1000.0 * seconds

    @property
    def draft_ms_per_row(self) -> float:
        return self._draft_ms / self._draft_rows if self._draft_rows else 0.0

    def pays(self, n_rows: int, gains: Sequence[float]) -> bool:
        """Whether drafting the first k positions of a branch with ``gains``
        (expected accepted tokens per position) in each of ``n_rows`` rows, for
        some k, yields more tokens per millisecond than a pass without the
        drafter: each row pays for its positions and for the drafter's time
        per row (if no k does, the generator skips the drafter)."""
        per, rows = self.cost.per_position, n_rows
        ms = self.cost.fixed + per * rows  # the pass without drafts
        total = 0.0
        for k, g in enumerate(gains, 1):
            total += g
            if total * ms > rows * (self.draft_ms_per_row + per * k):
                return True
        return False

    def select(self, rows: Sequence[Sequence]) -> List[List[int]]:
        """Lengths to keep of every branch of every row (0 = drop it); a branch is
        anything with ``tokens`` and ``gains`` (a drafter's Branch)."""
        keep = [[0] * len(branches) for branches in rows]
        used = [0] * len(rows)
        cands = []
        for r, branches in enumerate(rows):
            for i, br in enumerate(branches):
                for d, g in enumerate(br.gains or []):
                    # (gain, then shallower first, row, branch order): a branch's positions in order
                    cands.append((-g, d, r, i))
        cands.sort()
        tokens = float(len(rows))  # every row emits a token
        ms = self.cost.fixed + self.cost.per_position * len(rows)
        per = self.cost.per_position
        for neg_g, d, r, i in cands:
            g = -neg_g
            if g * ms <= per * tokens:  # the position adds fewer tokens per ms than the pass yields
                break
            if keep[r][i] != d or used[r] >= self.max_positions:
                continue  # its branch stopped earlier
            keep[r][i] = d + 1
            used[r] += 1
            tokens += g
            ms += per
        return keep
