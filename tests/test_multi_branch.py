"""Several drafts per pass (tree rows of the native engine), IAD's multi-branch
re-anchoring, the cost-aware draft budget and the edit-span counts of the bench."""
import random

import pytest

from fairseq_aggressive.bench.modes import mode_overrides
from fairseq_aggressive.evaluation.edit_spans import edit_spans, pass_bound, span_lengths
from fairseq_aggressive.draft_budget import DraftBudget, PassCost
from fairseq_aggressive.drafters import Drafter, DrafterCaps, DraftOutcome, InputCopyDrafter
from fairseq_aggressive.drafters.base import Branch
from fairseq_aggressive.options import check_draft_cost, check_iad_branches
from helpers import fast_first, make_model, make_sample, make_task
from test_equivalence import SHAPES, check, random_sources
from test_native import NATIVE_SHAPES, _decode, _same_bits, needs_native


class OracleBranches(Drafter):
    """Per pass, 1-4 branches in random order: greedy's own continuation
    (sometimes cut short or corrupted after a few tokens) among corrupted
    copies whose first token differs.  Any branch may win; exactness and the
    kept branch's cache must not depend on which."""

    caps = DrafterCaps(branches=True, max_branches=4)
    ref_offset = 0

    def __init__(self, ref, rng, vocab):
        self.ref = [r[0]["tokens"].tolist() for r in ref]
        self.rng, self.vocab = rng, vocab
        self.kept = []  # (index of the branch kept, index of greedy's branch)

    def begin(self, sample, max_len, encoder_out=None):
        pass

    def propose(self, sents, outputs, caps):
        out = []
        self._true = []
        for sent, output, cap in zip(sents, outputs, caps):
            ref = self.ref[sent + self.ref_offset][len(output):]
            n = min(cap, self.rng.choice([1, 2, 5, 40]))
            good = ref[:n]
            if good and self.rng.random() < 0.3:  # a late corruption: partly accepted
                j = self.rng.randrange(len(good))
                good = good[:j] + [self.rng.randrange(4, self.vocab)] + good[j + 1:]
            branches = [good] if good else []
            for _ in range(self.rng.randrange(0, 4)):
                if n < 1:
                    break
                bad = [self.rng.randrange(4, self.vocab) for _ in range(self.rng.randrange(1, n + 1))]
                if not ref or bad[0] != ref[0]:
                    branches.append(bad)
            order = list(range(len(branches)))
            self.rng.shuffle(order)
            self._true.append(order.index(0) if good else -1)
            out.append([Branch([*branches[i]]) for i in order] or [Branch([])])
        self._row = {s: i for i, s in enumerate(sents)}
        return out

    def update(self, sent, output, outcome):
        if outcome.n_match:
            self.kept.append((outcome.kept, self._true[self._row[sent]]))


@needs_native
@pytest.mark.parametrize("shape", fast_first(["post-norm, sinusoidal", "pre-norm, learned positions",
                                              "gelu, post-norm, 8 heads"]))
def test_tree_passes_are_bit_identical_to_native_greedy(shape):
    """Whichever branch wins, its positions see the cache, the last token and
    their own branch only, at their own output positions, and its keys and
    values move into place: the result equals the engine's greedy bit for bit."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=9, **NATIVE_SHAPES[shape])
    rng = random.Random(len(shape))
    rows = random_sources(rng, 24, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    ref, _ = _decode(model, task, rows, 1, max_len_b=40, max_draft_len=0)
    for bsz in (1, 8):
        drafter = OracleBranches(ref, rng, len(d))
        out, gen = _decode(model, task, rows, bsz, drafter=drafter, max_len_b=40)
        _same_bits(ref, out)
        assert gen.stats.tree_passes > 0 and gen.stats.branch_wins > 0
        # the pass kept greedy's branch whenever that one accepted something
        assert drafter.kept and all(k == t for k, t in drafter.kept if t >= 0)


@needs_native
def test_tree_row_bad_split_is_refused():
    task = make_task()
    d = task.target_dictionary
    from fairseq_aggressive.native import NativeEngine

    model = make_model(task, seed=1)
    batch = NativeEngine(model, d).begin(make_sample([[5, 6, 7, d.eos()]], d.pad())["net_input"]["src_tokens"], 20)
    with pytest.raises(ValueError, match="do not split"):
        batch.step([0], [[d.eos(), 5, 6, 7]], 20, 1, 0.0, 1.0, branches=[[1, 1]])
    with pytest.raises(ValueError, match="do not split"):
        batch.step([0], [[d.eos(), 5, 6]], 20, 1, 0.0, 1.0, branches=[[2, 0]])
    with pytest.raises(RuntimeError, match="does not fit"):  # beyond the cache: no room was asked for
        batch.step([0], [[d.eos()] + [5] * 30], 20, 1, 0.0, 1.0, branches=[[10, 10, 10]])
    emit, _, n_match, _, won = batch.step([0], [[d.eos(), 5, 6]], 20, 1, 0.0, 1.0, branches=[[1, 1]])
    assert len(emit[0]) == n_match[0] + 1 and won[0] in (0, 1)


SRC = [10, 11, 12, 13, 14, 15, 16, 17, 2]


def _iad(branches):
    task = make_task()
    d = task.target_dictionary
    drafter = InputCopyDrafter(d, d, branches=branches)
    drafter.begin(make_sample([SRC], d.pad()), 20)
    return drafter


def test_iad_branches_after_an_edit():
    """A rejection at source position 3 (the verifier emitted 40 instead of 13):
    the next pass tries the substitution (copy on at 14), the insertion (at 13),
    the deletion (at 15), ... one branch per distinct first token."""
    drafter = _iad(branches=3)
    assert [b.tokens for b in drafter.propose([0], [[]], [4])[0]] == [[10, 11, 12, 13]]
    out = [10, 11, 12, 40]
    drafter.update(0, out, _outcome(drafter, 0, 4, 3))
    branches = drafter.propose([0], [out], [4])[0]
    assert [b.tokens[0] for b in branches] == [14, 13, 15]
    assert {b.kind for b in branches} == {"sub", "ins", "del"}
    assert all(b.gains == sorted(b.gains, reverse=True) and 0 < b.gains[0] < 1 for b in branches)
    # the insertion branch (index 1) accepted 2 tokens, then another edit (99): branches around it
    out += [13, 14, 99]
    drafter.update(0, out, _outcome(drafter, 1, 4, 2))
    assert sorted(b.tokens[0] for b in drafter.propose([0], [out], [4])[0]) == [15, 16, 17]
    # the deletion branch accepted all its tokens and the verifier's next token continues it
    out += [17, 2]
    deletion = next(i for i, (b, _) in enumerate(drafter._proposed[0]) if b.kind == "del")
    drafter.update(0, out, _outcome(drafter, deletion, 1, 1))
    assert drafter.ptr[0] is None and drafter.anchor[0] == len(SRC)
    # one branch: the paper's drafter, nothing until a unique suffix re-anchors
    single = _iad(branches=1)
    single.propose([0], [[]], [4])
    single.update(0, [10, 11, 12, 40], _outcome(single, 0, 4, 3))
    assert [b.tokens for b in single.propose([0], [[10, 11, 12, 40]], [4])[0]] == [[]]


def _outcome(drafter, kept, n_draft, n_match):
    """Sentence 0's last proposal verified whole, but ``n_draft`` positions of the kept branch."""
    verified = [len(b.tokens) for b, _ in drafter._proposed.get(0, [])]
    verified[kept] = n_draft
    return DraftOutcome(verified, kept, n_match)


@pytest.mark.parametrize("shape", fast_first(["post-norm, sinusoidal", "pre-norm, learned positions",
                                              "deep-shallow 3+1, output dim differs"]))  # the last: torch verifier
@pytest.mark.parametrize("bsz", fast_first([8, 1]))
def test_multi_branch_iad_matches_greedy(shape, bsz):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=len(shape), **SHAPES[shape])
    rng = random.Random(bsz)
    rows = random_sources(rng, 32, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    for agg in (dict(max_draft_len=3), dict(draft_cost="auto"), dict(draft_cost="0.5,0.01", max_draft_len=8)):
        factory = lambda ref: InputCopyDrafter(d, d, branches=3)  # noqa: E731
        cmp = check(model, task, rows, bsz, gen_kw=dict(max_len_b=40), drafter_factory=factory, agg_kw=agg,
                    model_name=shape)  # (test_equivalence's model of this shape: the references kept once)
        assert cmp.identical + cmp.near_ties == len(rows)


def test_budget_keeps_positions_that_pay():
    copy = Branch(list(range(10)), [0.9 ** (i + 1) for i in range(10)])
    other = Branch([50, 51], [0.05, 0.04])
    # one row, a pass costs 10x a position: the copy's likely positions pay, the unlikely branch not
    keep = DraftBudget(PassCost(1.0, 0.1)).select([[copy, other]])
    assert 3 <= keep[0][0] <= 10 and keep[0][1] == 0
    # positions almost free: everything with a gain is kept
    assert DraftBudget(PassCost(1.0, 1e-4)).select([[copy, other]]) == [[10, 2]]
    # positions dear against the pass (or 32 rows sharing its fixed cost): nothing is drafted
    assert DraftBudget(PassCost(0.01, 1.0)).select([[copy, other]]) == [[0, 0]]
    many = DraftBudget(PassCost(1.0, 0.1)).select([[copy]] * 32)
    assert sum(k[0] for k in many) < 32 * keep[0][0]
    # a branch's positions are kept as a prefix, whatever the gains of other rows
    for lengths in DraftBudget(PassCost(2.0, 0.1)).select([[copy, other], [other, copy]]):
        assert all(n >= 0 for n in lengths)


def test_budget_fits_the_cost_to_the_iterations():
    # calibrated on a bare pass: 0.1 ms + 0.01 ms per position; the generator's iterations
    # cost 0.05 ms + 0.05 ms per position (Python per position the bare pass missed)
    budget = DraftBudget(PassCost(0.1, 0.01, measured=True, points=((1, 0.11), (5, 0.15))))
    for i in range(200):
        positions = 1 + i % 9
        budget.observe(positions, (0.05 + 0.05 * positions) / 1000.0)
    assert 0.045 < budget.cost.per_position < 0.052 and 0.04 < budget.cost.fixed < 0.07
    # a row's positions then cost what they earn only with gains near one: a batch of
    # 32 rows drafts nothing with copy-like gains (the old estimate kept many)
    copy = Branch(list(range(10)), [0.8 ** (i + 1) for i in range(10)])
    assert sum(k[0] for k in budget.select([[copy]] * 32)) == 0
    assert sum(k[0] for k in DraftBudget(PassCost(2.0, 0.01)).select([[copy]] * 32)) > 32
    # the gate before the drafter: a copy of gains 0.8, 0.68, ... pays for one row and a
    # drafter time of 0.03 ms per row, not for 32 rows; a drafter that costs 1 ms a row never pays
    gains = [0.8 * 0.85 ** i for i in range(8)]
    one = DraftBudget(PassCost(0.1, 0.025))
    one.observe_drafter(1, 0.00003)
    assert one.pays(1, gains) and not one.pays(32, gains)
    dear = DraftBudget(PassCost(0.1, 0.025))
    dear.observe_drafter(1, 0.001)
    assert not dear.pays(1, gains) and not dear.pays(1, [])
    # positions that never vary leave the calibration as it was
    same = DraftBudget(PassCost(0.1, 0.01, measured=True))
    for _ in range(5):
        same.observe(4, 0.001)
    assert (same.cost.fixed, same.cost.per_position) == (0.1, 0.01)


def test_edit_spans_and_bound():
    assert edit_spans([1, 2, 3], [1, 2, 3]) == 0 and pass_bound([1, 2, 3], [1, 2, 3]) == 1
    assert edit_spans([1, 2, 3, 4], [1, 9, 3, 4]) == 1  # substitution
    assert span_lengths([1, 2, 3, 4], [1, 9, 8, 3, 4]) == [2]  # substitution + insertion: one span
    assert edit_spans([1, 2, 3, 4, 5, 6], [1, 3, 4, 5, 9, 6]) == 2  # a deletion, a substitution
    assert pass_bound([1, 2, 3, 4, 5, 6], [1, 3, 4, 5, 9, 6]) == 3
    assert pass_bound([1, 2, 3], [1, 7, 8, 9, 2, 3]) == 4  # three new tokens: three passes after the first


def test_options_are_checked():
    assert check_iad_branches(3) == 3
    for bad in (0, 9, 1.5, "x"):
        with pytest.raises(ValueError, match="--iad-branches"):
            check_iad_branches(bad)
    assert check_draft_cost("0.2,0.03") == (0.2, 0.03)
    for bad in ("", "1", "a,b", "1,0", "-1,2", "1,2,3", "inf,1"):
        with pytest.raises(ValueError, match="--draft-cost"):
            check_draft_cost(bad)
    task = make_task()
    d = task.target_dictionary
    from fairseq_aggressive.generator import build_generator

    with pytest.raises(ValueError, match="--draft-cost"):
        build_generator([make_model(task)], d, InputCopyDrafter(d, d), draft_cost="fast")
    assert mode_overrides("iad@1024-b3-cost", None) == dict(beam=1, decoding="iad", iad_branches=3,
                                                             draft_cost="auto", max_draft_len=1024)
    assert mode_overrides("iad-b2", None)["iad_branches"] == 2


def test_span_predictability_counts():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "diagnostics" / "span_predictability.py"
    spec = importlib.util.spec_from_file_location("span_predictability", path)
    sp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sp)
    src, hyp, bos = [1, 2, 3, 4, 5, 2], [1, 7, 8, 9, 3, 4, 6, 2], 2  # spans: 7 8 9 (for 2), 6 (for 5)
    assert sp.passes_for(src, hyp, lambda ctx: None, bos) == pass_bound(src, hyp) == 5
    assert sp.passes_for(src, hyp, lambda ctx: hyp[len(ctx) - 1], bos) == 1 + edit_spans(src, hyp) == 3
    nxt = sp.NextToken(2)
    nxt.add([bos, 7, 8, 9])  # 8 after 7 is guessed, 9 after 8 too: the first span costs one pass
    assert sp.passes_for(src, hyp, nxt, bos) == 3
    nxt = sp.NextToken(3)
    nxt.add([bos, 7, 8, 5, 0, 8, 9])  # after (7, 8): 5; after 8 alone: 5 or 9, the first seen wins
    assert nxt([1, 7, 8]) == 5 and nxt([3, 8]) == 5 and nxt([0]) == 8 and nxt([42]) is None
    assert sp.passes_for(src, hyp, nxt, bos) == 4  # 8 guessed, 9 not
