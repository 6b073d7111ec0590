"""CTranslate2 greedy decoding as a benchmark baseline (bench modes ``ct2``,
``ct2-int8`` and ``ct2-best``), driven from the torch process but run in a
process of its own (:mod:`fairseq_aggressive.bench.ct2_worker`).

``ct2-best`` is CTranslate2 at its fastest configuration on the machine: every
compute type it supports on this CPU (float32, int8, int8_float32, int16,
bfloat16 ... as the CPU allows) at 1, 2, 4, ... threads up to the CPUs the
process may use, and as one-thread workers, one per CPU (``inter_threads``:
each batch split among them, its parts decoded at once), each timed on the
first sentences of the run (:func:`tune`); the fastest decodes the run.
Which one wins depends on the CPU and the batch (at batch 1 on Intel CPUs,
where CTranslate2 uses MKL, often int8 with one thread; on AMD ones its
float32; on batches, one-thread workers).

The checkpoint is converted once with CTranslate2's fairseq converter and the
result is cached beside it (``CKPT.ct2/``, or under ``~/.cache`` when that
directory is read-only); the cache is rebuilt when the checkpoint or the
CTranslate2 version changes.  int8 uses the same conversion with
``compute_type="int8"``.
"""
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ct2_worker.py")
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package: fairseq's --user-dir
# the compute type of each mode; ct2-best's is chosen by tune()
BEST = "ct2-best"
COMPUTE_TYPES = {"ct2": "float32", "ct2-int8": "int8", BEST: None}
# beam search widths of CTranslate2's modes (ct2-beam5, ct2-int8-beam4, ct2-best-beam5, ...)
BEAM_WIDTHS = (2, 3, 4, 5, 6, 8)
COMPUTE_TYPES.update({f"{name}-beam{k}": ct for name, ct in list(COMPUTE_TYPES.items()) for k in BEAM_WIDTHS})


def beam_of(mode: str) -> int:
    """The beam width of a CTranslate2 mode (1: greedy)."""
    m = re.fullmatch(r".*-beam(\d+)", mode)
    return int(m.group(1)) if m else 1


def is_best(mode: str) -> bool:
    """Whether a CTranslate2 mode picks its fastest configuration (ct2-best, ct2-best-beam5)."""
    return mode in COMPUTE_TYPES and COMPUTE_TYPES[mode] is None
# sentences of the run that ct2-best times every configuration on
PROBE_SENTENCES = 40


class CT2Error(RuntimeError):
    pass


def require() -> str:
    """The installed CTranslate2 version, or a clear error."""
    if importlib.util.find_spec("ctranslate2") is None:
        raise CT2Error(
            "benchmark modes ct2/ct2-int8 need CTranslate2: pip install 'fairseq-aggressive[ct2]' "
            "(or pip install ctranslate2)"
        )
    return importlib.metadata.version("ctranslate2")


def _stamp(ckpt: str, version: str) -> Dict:
    st = os.stat(ckpt)
    return {"checkpoint": os.path.abspath(ckpt), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctranslate2": version}


def _cache_dir(ckpt: str) -> str:
    beside = os.path.dirname(os.path.abspath(ckpt))
    if os.access(beside, os.W_OK):
        return os.path.abspath(ckpt) + ".ct2"
    key = hashlib.sha1(os.path.abspath(ckpt).encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser("~/.cache/fairseq-aggressive/ct2"), key)


def _converted_as(out: str, stamp: Dict) -> bool:
    """Whether ``out`` holds a conversion of the checkpoint ``stamp`` describes."""
    try:
        with open(os.path.join(out, "SOURCE.json")) as f:
            return json.load(f) == stamp
    except (OSError, ValueError):
        return False


def converted_model(ckpt: str, data_dir: str) -> str:
    """Directory of the CTranslate2 conversion of ``ckpt`` (converted on first use).

    Several processes may convert the same checkpoint at once (benchmarks run
    side by side): each converts into a directory of its own and renames it
    into place; a process that finds the place taken by a current conversion
    keeps that one."""
    version = require()
    out = _cache_dir(ckpt)
    stamp = _stamp(ckpt, version)
    if _converted_as(out, stamp):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp-", dir=os.path.dirname(out))
    try:
        proc = subprocess.run([sys.executable, WORKER, "convert", ckpt, data_dir, USER_DIR, tmp],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.isfile(os.path.join(tmp, "model.bin")):
            raise CT2Error(f"CTranslate2 could not convert {ckpt}:\n{proc.stderr[-2000:]}")
        with open(os.path.join(tmp, "SOURCE.json"), "w") as f:
            json.dump(stamp, f)
        for _ in range(3):
            try:
                os.rename(tmp, out)  # atomic; fails where a directory is in the way
                return out
            except OSError:
                if _converted_as(out, stamp):  # another process's conversion of the same checkpoint
                    return out
                shutil.rmtree(out, ignore_errors=True)  # an outdated conversion
        raise CT2Error(f"could not put the CTranslate2 conversion of {ckpt} in place at {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def adds_source_eos(model_dir: str) -> bool:
    """Whether the CTranslate2 model appends EOS to its sources itself (a fairseq
    conversion does; a transformers one takes the tokenizer's, EOS included)."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            return bool(json.load(f).get("add_source_eos", True))
    except (OSError, ValueError):
        return True


class Symbols:
    """Dictionary symbols <-> CTranslate2's tokens.  They are the same strings,
    but for an imported model whose text goes through GPT-2's byte-level BPE
    (BART: ``--bpe hf_gpt2``), whose dictionary lists the tokenizer's ids by
    number where CTranslate2's vocabulary lists its tokens."""

    SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")

    def __init__(self, ckpt: str):
        self.by_token = None
        meta = os.path.join(os.path.dirname(os.path.abspath(ckpt)), "MODEL.json")
        try:
            with open(meta) as f:
                text = json.load(f).get("text") or {}
        except (OSError, ValueError):
            text = {}
        if text.get("bpe") == "hf_gpt2":
            with open(os.path.join(os.path.dirname(meta), text["gpt2_encoder_json"]), encoding="utf-8") as f:
                self.by_token = json.load(f)
            self.by_id = {i: t for t, i in self.by_token.items()}

    def to_ct2(self, symbols: List[str]) -> List[str]:
        if self.by_token is None:
            return symbols
        return [self.by_id[int(s)] if s.isdigit() else s for s in symbols]

    def from_ct2(self, tokens: List[str]) -> List[str]:
        if self.by_token is None:
            return tokens
        return [t if t in self.SPECIAL else str(self.by_token.get(t, t)) for t in tokens]


def target_prefix(model, tgt_dict) -> Optional[List[str]]:
    """The tokens CTranslate2 must start each output with (``target_prefix``): an
    imported model's forced first token (transformers' ``forced_bos_token_id``), or
    the token its decoding starts from where that is a token of its own (an mBART
    cc25 model's target language: CTranslate2's conversion then has no start token
    and takes the prefix's first one), or None."""
    from ..models.hf_transformer import decoder_start, forced_first

    token, start = forced_first(model), decoder_start(model, tgt_dict)
    if token is None and start is not None and start not in (tgt_dict.eos(), tgt_dict.bos()):
        token = start
    return None if token is None else [tgt_dict[token]]


def compute_types() -> List[str]:
    """The compute types CTranslate2 supports on this CPU."""
    require()
    proc = subprocess.run([sys.executable, WORKER, "types"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CT2Error(f"CTranslate2 could not list its compute types:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def thread_counts(max_threads: int) -> List[int]:
    """1, 2, 4, ... up to max_threads, and max_threads."""
    counts, t = set(), 1
    while t < max_threads:
        counts.add(t)
        t *= 2
    return sorted(counts | {max(1, max_threads)})


def probe_batches(batches: List[Dict], sentences: int = PROBE_SENTENCES) -> List[Dict]:
    """The first batches of a run, up to ``sentences`` sentences (at least one batch)."""
    out, n = [], 0
    for b in batches:
        if out and n >= sentences:
            break
        out.append(b)
        n += len(b["tokens"])
    return out


def tune(model_dir: str, batches: List[Dict], threads: List[int], warmup: int, rounds: int = 2,
         workers: int = 1) -> Dict:
    """Times the decoding of ``batches`` (greedy, or their ``beam``) with every compute type of this CPU at
    each count of ``threads`` and (``workers`` > 1, batches of more than one sentence) as that many
    one-thread workers, ``rounds`` times in alternating order (a configuration's time is its fastest
    round, so a slow moment of the machine does not decide); returns ``{"compute_type", "threads",
    "workers"}`` of the fastest and ``"configs"``, every configuration with its seconds."""
    ways = [(t, 1) for t in threads]
    if workers > 1 and any(len(b["tokens"]) > 1 for b in batches):
        ways.append((1, workers))
    grid = [(ct, t, w) for ct in compute_types() for t, w in ways]
    seconds = {c: [] for c in grid}
    for r in range(rounds):
        for ct, t, w in (grid if r % 2 == 0 else grid[::-1]):
            res = decode(model_dir, batches, ct, t, warmup, w)
            seconds[(ct, t, w)].append(sum(b["seconds"] for b in res["batches"]))
    configs = [{"compute_type": ct, "threads": t, "workers": w, "seconds": min(seconds[(ct, t, w)])}
               for ct, t, w in grid]
    best = min(configs, key=lambda c: c["seconds"])
    return {"compute_type": best["compute_type"], "threads": best["threads"], "workers": best["workers"],
            "configs": configs}


def describe_config(compute_type: str, threads: int, workers: int = 1) -> str:
    """``int8, 1 thread``, ``float32, 2 threads``, ``int8, 2 workers of 1 thread``."""
    t = f"{threads} thread{'s' if threads > 1 else ''}"
    return f"{compute_type}, {workers} workers of {t}" if workers > 1 else f"{compute_type}, {t}"


def decode(model_dir: str, batches: List[Dict], compute_type: str, threads: int, warmup: int,
           workers: int = 1) -> Dict:
    """Decode ``batches`` ([{"tokens": [[str]], "max_len": int, "beam": int (default 1)}]) in a
    CTranslate2 process (``workers`` > 1: a translator with that many workers of ``threads``
    threads, each batch split among them); returns the worker's result (per batch seconds and
    hypotheses as token strings)."""
    request = {"compute_type": compute_type, "threads": threads, "workers": workers, "warmup": warmup,
               "batches": batches}
    return _worker("decode", model_dir, request, f"ct2 {describe_config(compute_type, threads, workers)}",
                   threads * workers)


def serve(model_dir: str, shards: List[List[Dict]], compute_type: str, threads: int, warmup: int) -> Dict:
    """Decode each shard's batches in its own client thread of one CTranslate2
    translator with ``inter_threads=len(shards)`` (``intra_threads=threads``),
    all shards at once (a service with that many workers); returns per shard
    the seconds and hypotheses of each batch, and the wall time of the whole."""
    request = {"compute_type": compute_type, "workers": len(shards), "threads": threads,
               "warmup": warmup, "shards": shards}
    return _worker("serve", model_dir, request, f"ct2 {compute_type}", threads * len(shards))


def _worker(command: str, model_dir: str, request: Dict, mode: str, omp_threads: int) -> Dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads))
    proc = subprocess.run([sys.executable, WORKER, command, model_dir], input=json.dumps(request),
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise CT2Error(f"CTranslate2 decoding failed ({mode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
