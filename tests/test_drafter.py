"""Unit tests of the input-copy drafter's state machine."""
import pytest

from fairseq_aggressive.drafters import DraftOutcome, InputCopyDrafter
from helpers import make_dict, make_sample


def first_draft(dr, sent, output, cap):
    """The first draft the drafter proposes for one sentence."""
    return dr.propose([sent], [output], [cap])[0][0].tokens


def drafter_for(src_ids, **kw):
    d = make_dict()
    dr = InputCopyDrafter(d, d, **kw)
    dr.begin(make_sample([src_ids + [d.eos()]], d.pad()), max_len=100)
    return dr, d


def test_first_draft_is_whole_source_with_eos_sentinel():
    dr, d = drafter_for([10, 11, 12])
    assert first_draft(dr, 0, [], 100) == [10, 11, 12, d.eos()]
    assert first_draft(dr, 0, [], 2) == [10, 11]  # Lmax / length cap


def test_full_acceptance_keeps_copying():
    dr, d = drafter_for([10, 11, 12, 13, 14])
    # drafted [10, 11], both accepted, verifier's next token 12 == source: continue at 13
    dr.update(0, [10, 11, 12], DraftOutcome([2], 0, 2))
    assert first_draft(dr, 0, [10, 11, 12], 100) == [13, 14, d.eos()]


def test_mismatch_resyncs_on_unique_suffix():
    dr, d = drafter_for([10, 11, 12, 13, 14])
    # substitution 11 -> 20: suffix (20,) is not in the source -> one-token mode
    dr.update(0, [10, 20], DraftOutcome([5], 0, 1))
    assert first_draft(dr, 0, [10, 20], 100) == []
    # next token 12 occurs once in the source: copy resumes after it
    dr.update(0, [10, 20, 12], DraftOutcome([0], 0, 0))
    assert first_draft(dr, 0, [10, 20, 12], 100) == [13, 14, d.eos()]


def test_ambiguous_suffix_needs_longer_ngram():
    dr, d = drafter_for([10, 11, 10, 12, 13])
    dr.update(0, [7], DraftOutcome([6], 0, 0))  # first draft rejected at once
    assert first_draft(dr, 0, [7], 100) == []
    dr.update(0, [7, 10], DraftOutcome([0], 0, 0))  # (10,) twice, (7, 10) never
    assert first_draft(dr, 0, [7, 10], 100) == []
    dr.update(0, [7, 11, 10], DraftOutcome([0], 0, 0))  # (10,) ambiguous, (11, 10) unique
    assert first_draft(dr, 0, [7, 11, 10], 100) == [12, 13, d.eos()]


def test_ngram_max_limits_disambiguation():
    dr, d = drafter_for([10, 10, 10, 10, 11], ngram_max=2)
    dr.update(0, [10], DraftOutcome([6], 0, 0))
    dr.update(0, [10, 10], DraftOutcome([0], 0, 0))  # (10,) and (10, 10) both repeated
    assert first_draft(dr, 0, [10, 10], 100) == []


@pytest.mark.parametrize("lo,hi", [(0, 2), (3, 2)])
def test_bad_ngram_range(lo, hi):
    d = make_dict()
    with pytest.raises(ValueError, match="ngram"):
        InputCopyDrafter(d, d, ngram_min=lo, ngram_max=hi)


def test_source_ids_mapped_to_target_dictionary():
    src = make_dict(10)
    tgt = make_dict(20)
    # a target dictionary with another symbol order
    tgt.symbols[4], tgt.symbols[5] = tgt.symbols[5], tgt.symbols[4]
    tgt.indices = {s: i for i, s in enumerate(tgt.symbols)}
    dr = InputCopyDrafter(src, tgt)
    dr.begin(make_sample([[4, 5, src.eos()]], src.pad()), max_len=100)
    assert first_draft(dr, 0, [], 10) == [5, 4, tgt.eos()]


def test_a_new_decoding_is_a_drafter_and_its_builder(monkeypatch):
    """A decoding registered in drafters.DECODINGS (a drafter and the function
    that builds it and its rule) is what --decoding NAME builds, through the
    task, with nothing else to change; its output is greedy's."""
    import argparse
    import random

    from fairseq_aggressive import drafters
    from fairseq_aggressive.acceptance import build_acceptance
    from fairseq_aggressive.drafters import Drafter, single_drafts
    from helpers import compare, greedy, make_model, make_task
    from test_equivalence import random_sources

    class Repeat(Drafter):  # drafts the last emitted token again, twice
        def begin(self, sample, max_len, encoder_out=None):
            pass

        def propose(self, sents, outputs, caps):
            return single_drafts([(o[-1:] * 2)[:c] for o, c in zip(outputs, caps)])

    monkeypatch.setitem(drafters.DECODINGS, "repeat", lambda opts, task, models: (Repeat(), build_acceptance()))
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=4)
    args = argparse.Namespace(decoding="repeat", beam=1, nbest=1, max_len_b=30)
    gen = task.build_generator([model], args)
    assert isinstance(gen.drafter, Repeat)
    sample = make_sample(random_sources(random.Random(2), 8, len(d), d.eos()), d.pad())
    assert compare(model, sample, greedy(model, d, sample, max_len_b=30), gen.generate([model], sample)).ok()
    assert gen.stats.drafted > 0
