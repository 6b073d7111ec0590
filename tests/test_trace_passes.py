"""scripts/diagnostics/trace_passes.py on the shipped 9+3: a pass-by-pass trace
of one sentence (drafts, what was accepted, the bifurcation, what was emitted)
whose emitted tokens add up to the output, equal to the engine loop's."""
import os
import re
import sys

import pytest

from helpers import ROOT, needs_native, python

pytestmark = needs_native


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_trace_of_a_sentence_with_an_edit():
    with open(os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), encoding="utf-8") as f:
        sentence = f.readlines()[8].strip()  # the model edits it inside a draft
    proc = python([sys.executable, os.path.join(ROOT, "scripts", "diagnostics", "trace_passes.py"),
                   os.path.join(ROOT, "models", "uagec-9x3"), sentence, "--draft-cost", "off"],
                  capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "equal to the engine loop's output: yes" in out
    assert re.search(r"bifurcation at \d+: drafted '[^']+', verifier '[^']+'", out)
    emitted = [ln.split(": ", 1)[1].split() for ln in out.splitlines() if ln.strip().startswith("emitted")]
    output = next(ln for ln in out.splitlines() if ln.startswith("output: "))[len("output: "):]
    tokens = [t for e in emitted for t in e if t != "</s>"]
    assert " ".join(tokens).replace("@@ ", "") == output
    n = int(re.search(r"^(\d+) passes;", out, re.M).group(1))
    assert n == len(emitted) > 1
