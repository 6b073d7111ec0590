"""One hook for a drafter's loop in the engine (docs/how-it-works.md, "One
hook per drafter"): drafters hand their loop to ``verifier.decode_in_engine``,
so no verifier names a drafter's loop; a drafter without a loop of its own
keeps the generator's per-pass path on the native engine, with the same
output, and the generator says so once per drafter class."""
import glob
import logging
import os
import re

import torch

from fairseq_aggressive.drafters import InputCopyDrafter
from fairseq_aggressive.generator import build_generator
from helpers import ROOT, make_model, make_sample, make_task, needs_native, random_rows


def test_no_verifier_names_a_drafters_loop():
    files = glob.glob(os.path.join(ROOT, "fairseq_aggressive", "verifiers", "*.py"))
    assert files
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        named = re.findall(r"decode_(?:copy|feature|blockwise)\b", text)
        assert not named, (path, named)


class RetouchedCopies(InputCopyDrafter):
    """Source copies proposed as InputCopyDrafter proposes them, from an
    overridden method: the engine's copy loop would not make these drafts."""

    def propose(self, sents, outputs, caps):
        return super().propose(sents, outputs, caps)


@needs_native
def test_a_drafter_without_an_engine_loop_runs_per_pass_and_says_so():
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    sample = make_sample(random_rows(d, 4, 3, 12, seed=5), d.pad())
    log = logging.getLogger("fairseq_aggressive")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        own = build_generator([model], d, InputCopyDrafter(d, d), engine="native", max_len_b=20,
                                  draft_cost="off")
        custom = build_generator([model], d, RetouchedCopies(d, d), engine="native", max_len_b=20,
                                     draft_cost="off")
        steps = {own: 0, custom: 0}
        for gen in steps:
            def counted(*a, _gen=gen, _step=gen.verifier.step, **k):
                steps[_gen] += 1
                return _step(*a, **k)
            gen.verifier.step = counted
        with torch.no_grad():
            ref = own.generate([model], sample)
            outs = [custom.generate([model], sample) for _ in range(2)]
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    notes = [r.getMessage() for r in seen if "drafts from Python here" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("RetouchedCopies"), notes
    assert steps[own] == 0 < steps[custom]  # one engine call per batch, against one per pass
    for out in outs:
        for a, b in zip(ref, out):
            assert torch.equal(a[0]["tokens"], b[0]["tokens"])
            assert torch.equal(a[0]["positional_scores"], b[0]["positional_scores"])
