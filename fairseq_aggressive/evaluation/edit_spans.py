"""Edit spans between a source and an output: the maximal runs of unmatched
steps in a Levenshtein alignment, and the fewest passes a drafter that copies
the source can need for that output (one per output token inside a span)."""
from typing import List, Tuple

from .m2 import distance_table


def edit_span_ranges(a: List[int], b: List[int], d=None) -> List[Tuple[int, int]]:
    """Per maximal run of unmatched steps (substitutions, insertions, deletions)
    in a Levenshtein alignment of ``a`` to ``b``, the range ``[start, end)`` of
    the tokens of ``b`` in it (empty for a deletion; the backtrace prefers
    matches, then substitutions).  ``d``: their table
    (:func:`~fairseq_aggressive.evaluation.m2.distance_table`), if already made."""
    n, m = len(a), len(b)
    d = distance_table(a, b) if d is None else d
    i, j, spans, in_span = n, m, [], False
    while i > 0 or j > 0:
        if i > 0 and j > 0 and a[i - 1] == b[j - 1] and d[i][j] == d[i - 1][j - 1]:
            i, j, in_span = i - 1, j - 1, False
            continue
        if not in_span:
            spans.append([j, j])
        in_span = True
        if i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + 1:
            i, j = i - 1, j - 1
        elif i > 0 and d[i][j] == d[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
        spans[-1][0] = j
    return [(s, e) for s, e in reversed(spans)]


def span_lengths(a: List[int], b: List[int], d=None) -> List[int]:
    """Per edit span (:func:`edit_span_ranges`), the tokens of ``b`` in it."""
    return [e - s for s, e in edit_span_ranges(a, b, d)]


def edit_spans(a: List[int], b: List[int]) -> int:
    """E: the maximal runs of unmatched steps in a Levenshtein alignment of ``a`` to ``b``."""
    return len(span_lengths(a, b))


def pass_bound(a: List[int], b: List[int]) -> int:
    """Fewest passes a drafter that copies ``a`` can need for output ``b``."""
    return bound_of_spans(span_lengths(a, b))


def bound_of_spans(spans: List[int]) -> int:
    """One pass, plus per edit span one per output token in it (a pass emits
    one token it did not draft), at least one (a deletion's span still ends a draft)."""
    return 1 + sum(max(1, k) for k in spans)
