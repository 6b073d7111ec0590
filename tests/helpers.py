"""Shared test helpers: tiny dictionaries, random-weight Transformers, stock greedy."""
import argparse
import random

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fairseq_aggressive  # noqa: F401
from fairseq_aggressive.native import available as _native_available
from fairseq_aggressive.tasks.aggressive_translation import (
    AggressiveTranslationConfig,
    AggressiveTranslationTask,
)

# why the native engine cannot run here (None: it runs), and the mark of tests that need it
NATIVE_REASON = _native_available()
needs_native = pytest.mark.skipif(NATIVE_REASON is not None, reason=f"no native engine here: {NATIVE_REASON}")


def fast_first(values, n=1):
    """Values of a parametrized test: the first ``n`` run in the fast tier, the others
    are marked slow (the same ids)."""
    return [v if i < n else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for i, v in enumerate(values)]


def make_dict(n_symbols=40):
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def random_rows(d, n, lo, hi, seed):
    """``n`` random sentences of ``lo``..``hi`` ordinary symbols of ``d`` plus EOS."""
    rng = random.Random(seed)
    return [[rng.randint(d.nspecial, len(d) - 1) for _ in range(rng.randint(lo, hi))] + [d.eos()]
            for _ in range(n)]


def crafted(rows):
    """(1, W, V) log-probabilities from rows of logits: scores to test rules on."""
    return torch.tensor(rows, dtype=torch.float).log_softmax(-1).unsqueeze(0)


def make_task(src_dict=None, tgt_dict=None, **cfg):
    src_dict = src_dict or make_dict()
    tgt_dict = tgt_dict or src_dict
    return AggressiveTranslationTask(AggressiveTranslationConfig(**cfg), src_dict, tgt_dict)


def model_args(arch="transformer", **overrides) -> argparse.Namespace:
    """The model args :func:`make_model` builds from (the architecture's defaults filled in)."""
    defaults = dict(
        encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
        encoder_layers=2, decoder_embed_dim=32, decoder_ffn_embed_dim=64,
        decoder_attention_heads=4, decoder_layers=2, dropout=0.0,
        max_source_positions=256, max_target_positions=256,
    )
    defaults.update(overrides)
    args = argparse.Namespace(arch=arch, **defaults)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def make_model(task, arch="transformer", seed=0, **overrides):
    """A random-weight fairseq Transformer; ``overrides`` are model args."""
    args = model_args(arch, **overrides)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    # sharpen the random output layer so greedy choices are far from ties
    proj = getattr(model.decoder, "output_projection", None)
    if proj is not None:
        with torch.no_grad():
            for p in proj.parameters():
                p.mul_(4.0)
    return model.eval()


def make_sample(src_rows, pad, left_pad=True):
    """A fairseq sample from lists of token ids (each ending with EOS)."""
    n = max(len(r) for r in src_rows)
    toks = torch.full((len(src_rows), n), pad, dtype=torch.long)
    for i, r in enumerate(src_rows):
        if left_pad:
            toks[i, n - len(r):] = torch.tensor(r)
        else:
            toks[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in src_rows])
    return {"id": torch.arange(len(src_rows)), "net_input": {"src_tokens": toks, "src_lengths": lengths}}


def greedy(model, tgt_dict, sample, prefix_tokens=None, **kw):
    gen = SequenceGenerator([model], tgt_dict, beam_size=1, **kw)
    return gen.generate([model], sample, prefix_tokens=prefix_tokens)


def greedy_rows(model, tgt_dict, rows, batch=8, **kw):
    """fairseq's greedy hypotheses of source ``rows`` (token lists ending in EOS), one per row,
    decoded ``batch`` rows at a time.  Where the length limit does not depend on the batch
    (``max_len_a`` 0, fairseq's default) a sentence's greedy output is the one it gets alone,
    up to float rounding in the last bits (which compare's near-tie and score tolerances
    cover), at a fraction of the time: the reference for batch-1 comparisons."""
    if kw.get("max_len_a"):
        raise ValueError("with max_len_a the length limit depends on the batch: decode the test's own batches")
    out = []
    for i in range(0, len(rows), batch):
        out += greedy(model, tgt_dict, make_sample(rows[i : i + batch], tgt_dict.pad()), **kw)
    return out


def aggressive(model, task, sample, drafter=None, **kw):
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator

    d = task.target_dictionary
    drafter = drafter or InputCopyDrafter(task.source_dictionary, d)
    gen = build_generator([model], d, drafter, **kw)
    return gen.generate([model], sample), gen


NEAR_TIE = 1e-4  # top-2 log-prob gap below which float noise may flip greedy's choice
SCORE_TOL = 1e-4


ALL_COMPARISONS = []  # every Comparison made in this test session (summed in conftest.py)


class Comparison:
    """Counts of aggressive-vs-greedy comparisons; every mismatch that is not a
    genuine near-tie is kept with its details."""

    def __init__(self):
        self.total = self.identical = self.near_ties = 0
        self.failures = []
        ALL_COMPARISONS.append(self)

    def ok(self):
        return not self.failures

    def __repr__(self):
        return (f"{self.total} compared, {self.identical} identical, "
                f"{self.near_ties} near-ties, {len(self.failures)} failures: {self.failures[:3]}")


def _top2_gap(model, sample, i, prefix, eos):
    """Greedy's top-2 log-prob gap after ``prefix`` for sentence ``i`` (full forward)."""
    net = sample["net_input"]
    src = net["src_tokens"][i : i + 1]
    prev = torch.tensor([[eos] + prefix], dtype=torch.long)
    with torch.no_grad():
        out = model(src, net["src_lengths"][i : i + 1], prev)
        lp = model.get_normalized_probs(out, log_probs=True)[0, -1]
    top = lp.topk(2).values
    return float(top[0] - top[1])


# int8 models (fairseq_aggressive/runtime/quantization.py): the native engine and torch
# round the float parts (norms, attention) differently in the last bit, and a
# last-bit change next to an activation's rounding boundary moves that int8
# value by one step, so logits of the two implementations may differ by about
# one quantization step (amax_x * amax_w / 127 ** 2 per flipped product), not
# by float noise.  Their near-tie and score tolerances are that much wider.
INT8_NEAR_TIE = 0.2
INT8_SCORE_TOL = 0.2


def compare(model, sample, ref, out, cmp=None, near_tie=None, score_tol=None):
    near_tie = NEAR_TIE if near_tie is None else near_tie
    score_tol = SCORE_TOL if score_tol is None else score_tol
    cmp = cmp or Comparison()
    eos = model.decoder.dictionary.eos()
    for i, (r, o) in enumerate(zip(ref, out)):
        cmp.total += 1
        rt, ot = r[0]["tokens"].tolist(), o[0]["tokens"].tolist()
        if rt == ot:
            ds = float((r[0]["positional_scores"] - o[0]["positional_scores"]).abs().max()) if rt else 0.0
            dscore = abs(float(r[0]["score"]) - float(o[0]["score"]))
            if ds > score_tol or dscore > score_tol:
                cmp.failures.append((i, "scores differ", ds, dscore))
            else:
                cmp.identical += 1
            continue
        k = next((j for j, (a, b) in enumerate(zip(rt, ot)) if a != b), min(len(rt), len(ot)))
        gap = _top2_gap(model, sample, i, rt[:k], eos)
        if gap < near_tie:
            cmp.near_ties += 1
        else:
            cmp.failures.append((i, "tokens differ", k, gap, rt, ot))
    return cmp


# ------------------------------------------------------------- command line
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import warm_python  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
USER_DIR = os.path.join(ROOT, "fairseq_aggressive")


GEC_MODEL = "models/uagec-9x3"  # the shipped GEC model (paths from the repository root, where the suite runs)
GEC_SAMPLE = "data/uagec-sample/test.tok.src"  # the bundled UA-GEC sample's tokenized sources


def sample_lines(n: int) -> list:
    """The first ``n`` sentences of the bundled UA-GEC sample (GEC_SAMPLE), stripped."""
    with open(os.path.join(ROOT, GEC_SAMPLE), encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def command_env() -> dict:
    """The environment of the commands the tests run: this process's, Python's warnings off."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def run(cmd, **kw):
    proc = warm_python.run(cmd, command_env(), ROOT, **kw)  # (subprocess.run, or a fork of a warm interpreter)
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def python(cmd, cwd=ROOT, env=None, check=False, capture_output=True, text=True, **kw):
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` (the same result), forked from
    a warm interpreter where ``cmd`` is a Python script of this environment (warm_python.py)."""
    assert capture_output and text, "the output is captured as text"
    proc = warm_python.run(cmd, command_env() if env is None else dict(env), str(cwd), **kw)
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return proc


def sample_test_size() -> int:
    """Sentences in the shipped UA-GEC sample's test split (every one is decoded)."""
    with open(os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), encoding="utf-8") as f:
        return sum(1 for _ in f)


def tool(name):
    return os.path.join(BIN, name)


def generate(data, ckpt, *extra):
    """fairseq-generate --beam 1 on the test split: ({id: hypothesis}, process)."""
    from fairseq_aggressive.evaluation.generate_output import parse_generate_lines

    proc = run([tool("fairseq-generate"), str(data), "--path", str(ckpt), "--user-dir", USER_DIR,
                "--task", "aggressive_translation", "--gen-subset", "test", "--beam", "1",
                "--batch-size", "16", "--remove-bpe", *extra])
    entries = parse_generate_lines(proc.stdout.splitlines())
    return {i: e["H"] for i, e in entries.items() if "H" in e}, proc
