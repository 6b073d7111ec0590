import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
torch_threads = int(os.environ.get("TEST_THREADS", "2"))

import torch  # noqa: E402

torch.set_num_threads(torch_threads)


def pytest_terminal_summary(terminalreporter):
    from helpers import ALL_COMPARISONS

    if ALL_COMPARISONS:
        tot = sum(c.total for c in ALL_COMPARISONS)
        ident = sum(c.identical for c in ALL_COMPARISONS)
        ties = sum(c.near_ties for c in ALL_COMPARISONS)
        bad = sum(len(c.failures) for c in ALL_COMPARISONS)
        terminalreporter.write_line(
            f"equivalence with stock greedy: {tot} hypotheses compared, {ident} identical "
            f"(tokens and scores), {ties} genuine near-ties, {bad} other differences"
        )
