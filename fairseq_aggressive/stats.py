"""What decoding counts: :class:`DecodingStats`, summed over every batch a
generator decodes (passes, tokens, drafted and accepted tokens, acceptance by
draft position), printed in fairseq-generate's summary line and reported by
the benchmark."""
from typing import Dict, List

from .native.c_api import LOOP_POSITIONS

# draft positions whose acceptance is counted one by one (the last counts every later one), as the
# native engine counts them (kLoopPositions in csrc/loop/counters.h)
COUNTED_POSITIONS = LOOP_POSITIONS


class DecodingStats:
    """Counters summed over all batches a generator has decoded."""

    def __init__(self):
        self.sentences = 0
        self.passes = 0  # decoder invocations (one per loop iteration per batch)
        self.sentence_passes = 0  # sum over sentences of the passes they took part in
        self.tokens = 0  # emitted tokens, EOS included
        self.drafted = 0  # drafted positions verified, every branch's
        self.accepted = 0  # drafted tokens that passed
        self.tree_passes = 0  # sentence passes that verified several branches
        self.branch_wins = 0  # ... where a branch other than the first accepted most
        self.draft_seconds = 0.0  # wall time spent in the drafter
        # per position of a draft (of the kept branch): passes whose draft had it, and whose token there passed
        self.position_drafted: List[int] = []
        self.position_accepted: List[int] = []

    def add_positions(self, drafted, accepted) -> None:
        """Adds per-position counts (lists, position 0 first; positions from
        COUNTED_POSITIONS - 1 on are counted together, as the engine's loop does)."""
        last = COUNTED_POSITIONS - 1
        for mine, theirs in ((self.position_drafted, drafted), (self.position_accepted, accepted)):
            for i, v in enumerate(theirs):
                if v:
                    i = min(i, last)
                    mine.extend([0] * (i + 1 - len(mine)))
                    mine[i] += v
        self.position_accepted.extend([0] * (len(self.position_drafted) - len(self.position_accepted)))

    def add_draft(self, n_draft: int, n_match: int) -> None:
        """Counts one draft: its first ``n_draft`` positions verified, the first
        ``n_match`` accepted (as :meth:`add_positions` with runs of ones)."""
        last = COUNTED_POSITIONS - 1
        for mine, n in ((self.position_drafted, n_draft), (self.position_accepted, n_match)):
            if len(mine) < min(n, COUNTED_POSITIONS):
                mine.extend([0] * (min(n, COUNTED_POSITIONS) - len(mine)))
            for i in range(min(n, last)):
                mine[i] += 1
            if n > last:
                mine[last] += n - last
        self.position_accepted.extend([0] * (len(self.position_drafted) - len(self.position_accepted)))

    def add_loop(self, st) -> None:
        """Adds the counters of a loop the engine ran itself (a LoopStats)."""
        self.passes += st.passes
        self.sentence_passes += st.sentence_passes
        self.drafted += st.drafted
        self.accepted += st.accepted
        self.draft_seconds += st.draft_ns / 1e9
        self.add_positions(list(st.position_drafted), list(st.position_accepted))

    def acceptance_by_position(self) -> List[float]:
        """Per draft position, the share of the drafts reaching it whose token there passed."""
        return [a / d if d else 0.0 for d, a in zip(self.position_drafted, self.position_accepted)]

    def as_dict(self) -> Dict[str, float]:
        d = dict(vars(self))
        d["mean_tokens_per_pass"] = self.tokens / max(self.sentence_passes, 1)
        d["mean_passes_per_sentence"] = self.sentence_passes / max(self.sentences, 1)
        d["wasted_per_pass"] = (self.drafted - self.accepted) / max(self.sentence_passes, 1)
        d["acceptance_by_position"] = self.acceptance_by_position()
        return d

    def summary(self) -> str:
        d = self.as_dict()
        return (
            f"{self.sentences} sentences, {self.sentence_passes} decoder passes "
            f"({d['mean_passes_per_sentence']:.2f} per sentence, {self.passes} batched), "
            f"{d['mean_tokens_per_pass']:.2f} tokens accepted per pass, "
            f"{self.accepted}/{self.drafted} drafted tokens accepted"
            + (f", {self.tree_passes} passes over several drafts ({self.branch_wins} kept another than the first)"
               if self.tree_passes else "")
            + (", accepted by draft position " + " ".join(f"{r:.2f}" for r in self.acceptance_by_position()[:8])
               if self.position_drafted else "")
        )
