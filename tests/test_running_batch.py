"""Continuous batching on the native engine (csrc/loop/running_batch.h): sentences
join a running batch between passes on random arrival schedules (1 to 32 at
once; IAD with the engine's draft-length budget, IAD with fixed drafts, greedy
search, and the feature drafter with and without the budget; float32 and the
int8 copy) and each one's tokens and scores are bit for bit those it gets
decoded alone."""
import random
import threading

import numpy as np
import pytest
import torch

from helpers import fast_first, needs_native, sample_lines

pytestmark = needs_native

MODEL = "models/uagec-9x3"
N_SENT = 48


@pytest.fixture(scope="module")
def hub():
    from fairseq_aggressive.translator import load_hub

    return load_hub(MODEL)


@pytest.fixture(scope="module")
def lines():
    return sample_lines(N_SENT)


def _alone(translator, tokens):
    """Tokens and positional scores of one sentence decoded alone by the translator's generator."""
    hub = translator.hub
    sample = {"id": torch.arange(1), "nsentences": 1, "ntokens": tokens.numel(),
              "net_input": {"src_tokens": tokens.view(1, -1), "src_lengths": torch.tensor([tokens.numel()])}}
    with torch.no_grad():
        h = hub.task.inference_step(translator.generator, hub.models, sample)[0][0]
    return h["tokens"].tolist(), h["positional_scores"].numpy().astype(np.float32)


def _running(translator, max_draft, budget, scores=True):
    from fairseq_aggressive.native.running import RunningBatch

    gen = translator.generator
    r = gen.verifier.rules
    return RunningBatch(gen.verifier.engine, first=gen.eos, max_draft=max_draft, ngram_min=gen.drafter.ngram_min,
                        ngram_max=gen.drafter.ngram_max, budget=budget, min_len=r.min_len,
                        unk_penalty=r.unk_penalty, temperature=r.temperature, scores=scores)


def _schedule(translator, batch, sources, seed, cap, copies=True):
    """Decodes ``sources`` (token tensors) arriving at random between passes,
    at most ``cap`` at once; per sentence its tokens and scores, and the most
    sentences that were decoding together."""
    from fairseq_aggressive.generator import length_cap

    gen, drafter = translator.generator, translator.generator.drafter
    rng = random.Random(seed)
    pending, slots, out, most = list(range(len(sources))), {}, {}, 0
    while pending or slots:
        room = cap - len(slots)
        k = min(room, rng.choice([0, 0, 1, 1, 2, 3, cap]), len(pending))
        if k > 0:
            grp, pending = pending[:k], pending[k:]
            lims = [length_cap(gen.max_len_a, gen.max_len_b, sources[i].numel(), gen.max_len) for i in grp]
            if copies:
                src = [sources[i].tolist() if drafter.src_to_tgt is None else drafter.src_to_tgt[sources[i]].tolist()
                       for i in grp]
            else:
                src = [[] for _ in grp]
            for s, i, lim in zip(batch.join([sources[i].tolist() for i in grp], src, lims), grp, lims):
                slots[s] = (i, lim)
        most = max(most, len(slots))
        for s in batch.run(rng.randint(1, 6)):
            i, lim = slots.pop(s)
            toks, scores, _ = batch.take(s, lim)
            out[i] = (toks, np.asarray(scores, dtype=np.float32))
    return out, most


@pytest.mark.parametrize("precision", fast_first(["float32", "int8"]))
def test_every_sentence_is_its_batch_1_output_on_any_schedule(hub, lines, precision):
    from fairseq_aggressive.translator import Translator, load_hub

    if precision == "int8":  # quantized in place: a hub of its own
        hub = load_hub(MODEL)
    settings = dict(decoding="iad") if precision == "float32" else dict(decoding="iad", inference_precision="int8")
    t = Translator(hub, **settings)
    t0 = Translator(hub, **settings, max_draft_len=0)  # greedy on the engine, alone
    sources = [hub.encode(s) for s in lines]
    alone = [_alone(t0, s) for s in sources]
    assert [_alone(t, s)[0] for s in sources[:8]] == [a[0] for a in alone[:8]]  # IAD alone: greedy's
    for mode, (max_draft, budget) in {"budget": (8, True), "fixed": (4, False), "greedy": (0, False)}.items():
        for seed, cap in ((1, 1), (2, 5), (3, 32)):
            batch = _running(t, max_draft, budget)
            out, most = _schedule(t, batch, sources, seed, cap)
            assert most == min(cap, len(sources)) or cap > 1 and most > 1, (mode, cap, most)
            for i, (toks, scores) in enumerate(alone):
                got_t, got_s = out[i]
                assert got_t == toks, (precision, mode, seed, cap, i)
                assert np.array_equal(got_s.view(np.uint32), scores.view(np.uint32)), (precision, mode, seed, cap, i)
            st = batch.stats()
            assert st.joined == st.left == len(sources) and batch.active == 0
            if max_draft:
                assert st.accepted > 0  # drafts were verified and accepted
            else:
                assert st.drafted == 0


def test_without_scores_the_tokens_are_the_same(hub, lines):
    """A running batch that keeps no scores (streams, the server) sums a
    log-normaliser only for each pass's last token where the draft-length
    policy reads its confidence, or none: the same tokens as decoded alone, on
    any schedule, every score NaN."""
    from fairseq_aggressive.translator import Translator

    t = Translator(hub, decoding="iad")
    t0 = Translator(hub, decoding="iad", max_draft_len=0)
    sources = [hub.encode(s) for s in lines[:24]]
    alone = [_alone(t0, s)[0] for s in sources]
    for mode, (max_draft, budget) in {"budget": (8, True), "fixed": (4, False), "greedy": (0, False)}.items():
        for seed, cap in ((7, 1), (8, 9)):
            batch = _running(t, max_draft, budget, scores=False)
            out, _ = _schedule(t, batch, sources, seed, cap)
            for i, toks in enumerate(alone):
                assert out[i][0] == toks, (mode, seed, cap, i)
                assert np.isnan(out[i][1]).all(), (mode, seed, cap, i)
            if max_draft:
                assert batch.stats().accepted > 0


def test_wake_ends_a_run_at_the_next_pass(hub, lines):
    from fairseq_aggressive.translator import Translator

    t = Translator(hub, decoding="iad", max_draft_len=0)
    batch = _running(t, 0, False)
    src = hub.encode(lines[0])
    batch.join([src.tolist()], [src.tolist()], [200])
    before = batch.stats().passes
    batch.wake()
    assert batch.run(1 << 20) == []  # returned after one pass, the sentence unfinished
    assert batch.stats().passes == before + 1 and batch.active == 1
    # without a wake the run goes on to the sentence's end
    done = batch.run(1 << 20)
    assert len(done) == 1 and batch.active == 0
    # a wake from another thread while a run is under way
    batch.join([src.tolist()] * 4, [src.tolist()] * 4, [200] * 4)
    waker = threading.Thread(target=batch.wake)
    waker.start()
    waker.join()
    assert batch.run(1 << 20) == [] or batch.active < 4


def test_bad_joins_and_takes_are_refused(hub, lines):
    from fairseq_aggressive.translator import Translator

    t = Translator(hub, decoding="iad")
    batch = _running(t, 8, True)
    src = hub.encode(lines[0]).tolist()
    with pytest.raises(ValueError, match="cannot join"):
        batch.join([src], [src], [0])  # a length limit below 1
    with pytest.raises(ValueError, match="cannot join"):
        batch.join([[]], [src], [10])  # an empty source
    with pytest.raises(ValueError, match="sources"):
        batch.join([src, src], [src], [10, 10])
    (slot,) = batch.join([src], [src], [50])
    with pytest.raises(ValueError, match="has not finished"):
        batch.take(slot, 50)
    assert batch.stats().joined == 1  # the refused joins joined nothing


STUDENT = "models/ende-student-6x1"
FEATURE_DRAFTER = "models/ende-student-6x1-feature-drafter/model.pt"


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_feature_drafts_give_every_sentence_its_batch_1_output(precision):
    """The shipped en-de student with its feature drafter (a second decoder
    with slots of its own) on random schedules: bit for bit each sentence's
    greedy output decoded alone, drafts verified as made and under the policy
    (which also chooses how many tokens the drafter drafts)."""
    from fairseq_aggressive.translator import Translator, load_hub

    hub = load_hub(STUDENT)
    extra = dict(inference_precision="int8") if precision == "int8" else {}
    t = Translator(hub, decoding="feature-ar", drafter_path=FEATURE_DRAFTER, **extra)
    t0 = Translator(hub, decoding="iad", max_draft_len=0, **extra)  # the engine's greedy, alone
    with open("data/debian-ende-sample/test.tok.en", encoding="utf-8") as f:
        sources = [hub.encode(next(f).strip()) for _ in range(40)]
    alone = [_alone(t0, s) for s in sources]
    gen, dr = t.generator, t.generator.drafter
    r = gen.verifier.rules
    from fairseq_aggressive.native.running import RunningBatch

    for budget in (False, True):
        for seed, cap in ((4, 1), (5, 7), (6, 32)):
            batch = RunningBatch(gen.verifier.engine, first=gen.eos, max_draft=-1, budget=budget, min_len=r.min_len,
                                 unk_penalty=r.unk_penalty, temperature=r.temperature, drafter=dr.native.engine,
                                 bos=dr.bos, k=dr.k, room=dr.max_positions - 1, min_prob=dr.min_prob,
                                 shared_encoder=dr.caps.encoder_out)
            out, most = _schedule(t, batch, sources, seed, cap, copies=False)
            assert most > 1 or cap == 1
            for i, (toks, scores) in enumerate(alone):
                assert out[i][0] == toks, (precision, budget, seed, cap, i)
                assert np.array_equal(out[i][1].view(np.uint32), scores.view(np.uint32)), (precision, budget, cap, i)
            st = batch.stats()
            assert st.joined == st.left == len(sources)
            if not budget:
                assert st.accepted > 2 * st.passes  # the drafter's drafts were verified and mostly accepted
