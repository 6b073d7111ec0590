"""The draft -> verify -> accept loop of source-copy drafting (IAD, one branch)
and greedy search inside the native engine (fa_decode with the copy and greedy drafters): with fixed
drafts (``draft_cost="off"``) bit-identical to the generator's own loop over
the same drafter, statistics and what the drafter learns included; with the
engine's draft-length budget (IAD's default) bit-identical to greedy in its
output; and used wherever it applies."""
import random

import numpy as np
import pytest
import torch

from fairseq_aggressive.constants import DEFAULT_MAX_DRAFT_LEN
from fairseq_aggressive.draft_policy import EngineBudget
from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator
from fairseq_aggressive.stats import COUNTED_POSITIONS
from fairseq_aggressive.native import NativeBatch
from fairseq_aggressive.native import c_api
from fairseq_aggressive.native.c_api import LOOP_POSITIONS
from fairseq_aggressive.native.running import run_settings
from helpers import compare, fast_first, greedy, make_dict, make_model, make_sample, make_task, needs_native
from test_equivalence import batches, random_sources

ENGINE_BUDGET_CAP = DEFAULT_MAX_DRAFT_LEN["engine"]

pytestmark = needs_native


class EditedCopyDrafter(InputCopyDrafter):
    """IAD whose copy sources are given: greedy's outputs with edits (tokens
    substituted, inserted, deleted, repeated n-grams), so that drafts are
    accepted for long runs and rejected after each edit, and re-anchoring has
    unique and ambiguous suffixes to find.  Both loops copy these sources."""

    def __init__(self, d, sources, **kw):
        super().__init__(d, d, **kw)
        self.sources = sources  # per batch, per sentence

    def use(self, i):
        self.batch = self.sources[i]

    def begin(self, sample, max_len, encoder_out=None):
        super().begin(sample, max_len, encoder_out)
        self.src = [list(s) for s in self.batch]

    def copy_source(self, sample):
        import numpy as np

        return (np.array([t for s in self.batch for t in s], dtype=np.int32),
                np.array([len(s) for s in self.batch], dtype=np.int32))


def _edited(rng, ref, vocab, eos, p=0.12):
    out = []
    for t in ref[:-1]:
        u = rng.random()
        if u < p / 3:
            out.append(rng.randrange(4, vocab))  # substituted
        elif u < 2 * p / 3:
            out += [t, rng.randrange(4, vocab)]  # inserted after
        elif u >= p:
            out.append(t)  # (else deleted)
        if rng.random() < 0.05:
            out += out[-3:]  # a repeated n-gram: ambiguous suffixes
    return out + [eos]


def _run(model, d, rows, bsz, sources, engine_loop, gen_kw, drafter_kw, bos=None):
    drafter = EditedCopyDrafter(d, sources, **drafter_kw)
    gen = build_generator([model], d, drafter, engine="native", engine_loop=engine_loop, **gen_kw)
    gen.verifier.lanes = 1  # each batch whole: its passes counted as the generator's loop counts them
    outs, passes = [], []
    for i, chunk in enumerate(batches(rows, bsz)):
        drafter.use(i)
        outs += gen.generate([model], make_sample(chunk, d.pad()), bos_token=bos)
        passes += list(gen.last_sentence_passes)
    learnt = ({k: (r.hits, r.trials) for k, r in drafter.first.items()}, (drafter.cont.hits, drafter.cont.trials),
              dict(drafter.wins))
    return outs, passes, gen.stats, learnt


def _bits(outs):
    return [(o[0]["tokens"].tolist(), o[0]["positional_scores"].tolist(), float(o[0]["score"])) for o in outs]


def _counters(stats):
    d = stats.as_dict()
    d.pop("draft_seconds")
    return d


@pytest.mark.parametrize("bsz", fast_first([8, 1]))
@pytest.mark.parametrize("lmax", fast_first([4, 0, 1, 1024], 2))
@pytest.mark.parametrize("gen_kw", fast_first([dict(max_len_b=40), dict(max_len_a=0, max_len_b=5),
                                               dict(min_len=6, unk_penalty=-2.0, temperature=0.8, max_len_b=40)]),
                         ids=["plain", "max-len", "min-len-unkpen-temperature"])
def test_engine_loop_equals_the_generators_loop(bsz, lmax, gen_kw):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=5)
    rng = random.Random(bsz * 100 + lmax)
    rows = random_sources(rng, 24, len(d), d.eos()) + random_sources(rng, 8, len(d), d.eos(), repeat=True)
    kw = dict(gen_kw, max_draft_len=lmax, draft_cost="off")  # the drafts as made: the generator's loop's counters
    ref = greedy(model, d, make_sample(rows, d.pad()), **gen_kw)
    sources = [[_edited(rng, r[0]["tokens"].tolist(), len(d), d.eos()) for r in chunk] for chunk in batches(ref, bsz)]
    a = _run(model, d, rows, bsz, sources, True, kw, {})
    b = _run(model, d, rows, bsz, sources, False, kw, {})
    assert _bits(a[0]) == _bits(b[0])
    assert a[1] == b[1]  # passes per sentence
    assert _counters(a[2]) == _counters(b[2])
    assert a[3] == b[3]  # the drafter's rates and wins
    assert compare(model, make_sample(rows, d.pad()), ref, a[0]).ok()
    if lmax:  # the drafts were exercised: long accepted runs, rejections, re-anchoring
        assert a[2].accepted > a[2].sentences and a[2].position_drafted[0] > a[2].position_accepted[0] > 0
        assert a[3][0]["sync"][1] > 0 or gen_kw.get("max_len_b") == 5
    else:
        assert a[2].drafted == 0 and a[2].position_drafted == []


def test_engine_loop_re_anchors_on_every_suffix_length_and_a_bos():
    """ngram ranges 1..1, 2..3 and 1..6, with the loop started from a BOS token:
    the same drafts, output and counts as the generator's loop (fixed drafts)."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=8)
    rng = random.Random(4)
    rows = random_sources(rng, 16, len(d), d.eos(), repeat=True)
    ref = greedy(model, d, make_sample(rows, d.pad()), max_len_b=30)
    sources = [[_edited(rng, r[0]["tokens"].tolist(), len(d), d.eos(), p=0.3) for r in chunk] for chunk in batches(ref, 4)]
    for lo, hi in ((1, 1), (2, 3), (1, 6)):
        dk = dict(ngram_min=lo, ngram_max=hi)
        kw = dict(max_len_b=30, max_draft_len=6, draft_cost="off")
        a = _run(model, d, rows, 4, sources, True, kw, dk, bos=d.bos())
        b = _run(model, d, rows, 4, sources, False, kw, dk, bos=d.bos())
        assert _bits(a[0]) == _bits(b[0]) and a[1] == b[1] and a[3] == b[3]
        assert _counters(a[2]) == _counters(b[2])


def test_engine_loop_with_separate_dictionaries_copies_mapped_ids():
    src_d, tgt_d = make_dict(40), make_dict(40)
    tgt_d.add_symbol("extra")  # another dictionary: source ids map to target ids
    task = make_task(src_d, tgt_d)
    model = make_model(task, seed=2)
    rows = random_sources(random.Random(5), 16, len(src_d), src_d.eos())
    outs, counts = [], []
    # fixed drafts in the engine's loop and the generator's (the same counters), the engine's budget (the same output)
    for engine_loop, draft_cost in ((True, "off"), (False, "off"), (True, None)):
        gen = build_generator([model], tgt_d, InputCopyDrafter(src_d, tgt_d), engine="native",
                                  engine_loop=engine_loop, draft_cost=draft_cost, max_len_b=30)
        gen.verifier.lanes = 1  # (each batch whole: the generator's loop's pass counts)
        outs.append([_bits(gen.generate([model], make_sample(c, src_d.pad()))) for c in batches(rows, 8)])
        assert gen.drafter.src_to_tgt is not None
        counts.append(_counters(gen.stats))
    assert outs[0] == outs[1] == outs[2] and counts[0] == counts[1]


@pytest.mark.parametrize("bsz", fast_first([16, 1, 3]))
def test_engine_budget_gives_greedys_output(monkeypatch, bsz):
    """IAD's default on the native engine (:class:`EngineBudget`): the engine's
    loop verifies per pass and row the lengths its draft-length policy chooses
    (up to ENGINE_BUDGET_CAP), with the real sources and with greedy's outputs
    edited (long accepted runs): greedy's tokens and positional scores bit for
    bit, those of the engine's greedy (a draft cap of 0), the torch verifier's
    greedy and stock greedy within float noise; fixed drafts
    (``draft_cost="off"``) count otherwise, so the budget changed the lengths."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=5)
    rng = random.Random(bsz)
    rows = random_sources(rng, 32, len(d), d.eos()) + random_sources(rng, 16, len(d), d.eos(), repeat=True)
    steps = []
    real = NativeBatch.step
    monkeypatch.setattr(NativeBatch, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))

    def run(drafter, engine="native", **kw):
        gen = build_generator([model], d, drafter, engine=engine, max_len_b=40, **kw)
        outs = []
        for i, chunk in enumerate(batches(rows, bsz)):
            if isinstance(drafter, EditedCopyDrafter):
                drafter.use(i)
            outs += gen.generate([model], make_sample(chunk, d.pad()))
        return outs, gen

    ref, g0 = run(InputCopyDrafter(d, d), max_draft_len=0, draft_cost="off")  # the engine's greedy
    assert g0.stats.drafted == 0
    on_torch, _ = run(InputCopyDrafter(d, d), engine="torch", max_draft_len=0)
    sample = make_sample(rows, d.pad())
    for other in (on_torch, greedy(model, d, sample, max_len_b=40)):
        cmp = compare(model, sample, other, ref)
        assert cmp.ok() and cmp.identical == len(rows), cmp
    sources = [[_edited(rng, r[0]["tokens"].tolist(), len(d), d.eos()) for r in chunk] for chunk in batches(ref, bsz)]
    for make in (lambda: InputCopyDrafter(d, d), lambda: EditedCopyDrafter(d, sources)):
        steps.clear()
        out, budget = run(make())
        assert isinstance(budget.policy, EngineBudget) and budget.max_draft_len == ENGINE_BUDGET_CAP
        assert not steps  # every pass in the engine's loop
        assert _bits(out) == _bits(ref)
        fixed_out, fixed = run(make(), draft_cost="off")
        assert not fixed.policy.engine_budget and _bits(fixed_out) == _bits(ref)
        assert fixed.stats.drafted > 0 and _counters(budget.stats) != _counters(fixed.stats)
        if bsz == 1 and isinstance(budget.drafter, EditedCopyDrafter):  # a lone sentence drafts
            assert budget.stats.accepted > 0


def test_the_engine_loop_runs_wherever_it_applies(monkeypatch):
    """IAD with one branch and greedy search (draft cap 0) on the native engine
    never make a pass from Python, by the engine's draft-length budget unless
    ``draft_cost="off"`` (fixed drafts); several branches, a given draft cost
    and engine_loop=False do."""
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1)
    sample = make_sample(random_sources(random.Random(1), 6, len(d), d.eos()), d.pad())
    steps, budgets = [], []
    real, real_loop = NativeBatch.step, NativeBatch.decode
    monkeypatch.setattr(NativeBatch, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    monkeypatch.setattr(NativeBatch, "decode",
                        lambda self, s, *a, **k: budgets.append(bool(s.budget)) or real_loop(self, s, *a, **k))
    for kw, python_passes, budget in ((dict(), False, True), (dict(draft_cost="auto"), False, True),
                                      (dict(draft_cost="off"), False, False), (dict(max_draft_len=0), False, True),
                                      (dict(engine_loop=False), True, None), (dict(draft_cost="1,0.1"), True, None)):
        steps.clear()
        budgets.clear()
        gen = build_generator([model], d, InputCopyDrafter(d, d), engine="native", max_len_b=20, **kw)
        gen.generate([model], sample)
        assert bool(steps) == python_passes, kw
        # (one call per lane the batch is dealt among)
        assert (budgets == []) if budget is None else (budgets and set(budgets) == {budget}), kw
        engine_budget = kw.get("draft_cost") in (None, "auto") and kw.get("engine_loop", True)
        assert isinstance(gen.policy, EngineBudget) == engine_budget, kw  # (the generator's loop: fixed drafts)
    steps.clear()
    gen = build_generator([model], d, InputCopyDrafter(d, d, branches=3), engine="native", max_len_b=20)
    gen.generate([model], sample)
    assert steps

    class OtherSources(InputCopyDrafter):  # copies what begin() sets, which copy_source() does not know
        def begin(self, sample, max_len, encoder_out=None):
            super().begin(sample, max_len, encoder_out)
            self.src = [s[::-1] for s in self.src]

    steps.clear()
    gen = build_generator([model], d, OtherSources(d, d), engine="native", max_len_b=20)
    gen.generate([model], sample)
    assert steps and OtherSources(d, d).copy_loop() is None


def test_engine_loop_refuses_what_does_not_fit():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1)
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine="native", max_len_b=20)
    src = torch.tensor([[5, 6, 7, d.eos()], [d.pad(), 8, 9, d.eos()]])
    flat, lens = InputCopyDrafter(d, d).copy_source(make_sample([[5, 6, 7, d.eos()], [8, 9, d.eos()]], d.pad()))
    batch = gen.native.begin(src, 20)
    settings = run_settings("copy", d.eos(), 4, ngram_min=1, ngram_max=4)
    with pytest.raises(ValueError, match="lengths adding up"):
        batch.decode(settings, 20, flat[:-1], np.append(lens[:-1], lens[-1] + 1))
    with pytest.raises(ValueError, match="copy sources"):
        batch.decode(settings, 20, flat[:4], lens[:1])  # one source for two sentences
    with pytest.raises(ValueError, match="does not fit the batch"):
        batch.decode(settings, 0, flat, lens)  # no room for a token
    with pytest.raises(ValueError, match="suffix lengths"):
        run_settings("copy", d.eos(), 4, ngram_min=0)
    with pytest.raises(ValueError, match="no engine drafter named"):
        run_settings("copies", d.eos(), 4)
    toks, scores, passes, stats = batch.decode(settings, 20, flat, lens)
    assert len(toks) == 2 and all(t[-1] == d.eos() for t in toks) and stats.sentence_passes == sum(passes)
    with pytest.raises(ValueError, match="decodes once"):  # its sentences are decoded
        batch.decode(settings, 20, flat, lens)


def test_no_cap_is_none():
    """A draft cap of None is no cap, in the static loop and in a running
    batch: the drafts of a cap beyond every sentence's length, and the same
    output as greedy search."""
    from fairseq_aggressive.native.running import RunningBatch

    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=1)
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine="native", max_len_b=20)
    rows = [[5, 6, 7, 8, 9, 10, d.eos()], [8, 9, 10, 11, d.eos()]]
    sample = make_sample(rows, d.pad())
    flat, lens = InputCopyDrafter(d, d).copy_source(sample)
    src = sample["net_input"]["src_tokens"]
    out = {cap: gen.native.begin(src, 20).decode(run_settings("copy", d.eos(), cap), 20, flat, lens)
           for cap in (None, 1000, 0)}
    assert out[None][0] == out[1000][0] == out[0][0]
    assert list(out[None][3].position_drafted) == list(out[1000][3].position_drafted)
    assert out[None][3].drafted > 0 == out[0][3].drafted
    running = {}
    for cap in (None, 1000):
        batch = RunningBatch(gen.native, first=d.eos(), max_draft=cap, budget=False)
        slots = batch.join([r for r in rows], [r[:-1] for r in rows], [20, 20])
        done = []
        while len(done) < len(slots):
            done += batch.run()
        running[cap] = ([batch.take(s, 20)[0] for s in slots], batch.stats().drafted)
    assert running[None] == running[1000] and running[None][1] > 0


def test_counted_positions_agree():
    assert COUNTED_POSITIONS == LOOP_POSITIONS


def test_the_servers_metrics_count_as_many_positions():
    from fairseq_aggressive.serving.metrics import POSITIONS

    assert POSITIONS == LOOP_POSITIONS
