"""Every interleaving of the thread pool's protocol (csrc/pool/parallel.h), as the
explicit-state model in pool_model.py: one caller and two workers over calls
of changing item counts lose no item, run none twice and never deadlock; the
same checker finds the race of a bound stored apart from the job word and the
lost wake-up of a worker that reads caller_waiting_ before it counts."""
import pytest

from helpers import fast_first
from pool_model import explore


@pytest.mark.timeout(300)
@pytest.mark.parametrize("items,workers", fast_first([((2, 3), 1), ((2, 3), 2), ((2, 3, 2), 2), ((3, 2), 2)], n=2))
def test_every_interleaving_runs_every_item_once(items, workers):
    violation, states = explore(items, workers)
    assert violation is None, (violation.what, "\n".join(violation.trace))
    assert states > 1000  # the model moved: each thread's steps interleaved


@pytest.mark.parametrize("workers", [1, 2])
def test_the_checker_finds_a_bound_stored_apart_from_the_word(workers):
    violation, _ = explore((2, 3), workers, split_bound=True)
    assert violation is not None
    assert "ran job_ 1" in violation.what  # a claim of the finished job ran the next job's item
    steps = violation.trace
    # the delayed claim: a worker loads the old word, the caller stores the next bound, the CAS succeeds
    assert any(s.endswith("split_n_ = n") for s in steps)
    assert steps[-1].startswith("w") and "run item" in steps[-1]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_checker_finds_a_lost_wake_up(workers):
    violation, _ = explore((2, 3), workers, waiting_before_count=True)
    assert violation is not None and violation.what.startswith("deadlock: caller at ('cv_waiting'")
