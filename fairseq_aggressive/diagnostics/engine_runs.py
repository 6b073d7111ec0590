"""Greedy and IAD generators on a given engine library, and timed runs of a
sentence, as the diagnostic scripts that compare engine builds or settings
(scripts/diagnostics/compare_builds.py, product_pieces.py,
threads_side_by_side.py) time them."""
import sys
import time

import torch

from fairseq_aggressive.diagnostics.loading import load_model_and_samples


def generators_on(lib, model, task, threads):
    """``{"greedy": ..., "iad": ...}``: batch-1 generators (greedy: the engine's,
    ``max_draft_len=0``; IAD: the engine's loop) whose engines run ``lib``."""
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.native import engine

    d = task.target_dictionary
    default_library = engine.library
    try:
        engine.library = lambda isa=None: lib
        return {mode: build_generator([model], d, InputCopyDrafter(task.source_dictionary, d), max_len_a=1.2,
                                          max_len_b=10, max_draft_len=draft, engine="native", native_threads=threads)
                for mode, draft in (("greedy", 0), ("iad", None))}
    finally:
        engine.library = default_library


def decode_run(generator, model):
    """run(sample) -> (seconds, (tokens, positional scores' bytes)) of the first hypothesis"""
    def run(sample):
        t0 = time.perf_counter()
        h = generator.generate([model], sample)[0][0]
        return time.perf_counter() - t0, (tuple(h["tokens"].tolist()), h["positional_scores"].numpy().tobytes())
    return run


def encode_run(eng):
    """run(sample) -> (seconds, the encoder output's bytes): the engine's encoder alone (with the
    decoder's keys and values of the source, as a batch begins)"""
    def run(sample):
        src = sample["net_input"]["src_tokens"]
        t0 = time.perf_counter()
        batch = eng.begin(src, int(src.size(1) * 1.2) + 10)
        dt = time.perf_counter() - t0
        return dt, batch.encoder_out()["encoder_out"][0].numpy().tobytes()
    return run


def add_run_options(ap, precision="float32", rounds=3):
    """The options of such a comparison's runs: --subset, --sentences, --threads, --precision,
    --rounds and --load (CPU-bound processes beside it)."""
    ap.add_argument("--subset", default="test")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["float32", "int8"], default=precision)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")


def load_for_runs(a, get_library, torch_threads):
    """``(get_library(), model, task, samples)`` for options ``a`` (:func:`add_run_options` and
    ``data``/``path``), torch held to ``torch_threads``; None after printing the error when the
    engine library cannot be loaded."""
    from fairseq_aggressive.native.build import NativeUnavailable

    try:
        lib = get_library()
    except NativeUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    torch.set_num_threads(torch_threads)
    model, task, samples = load_model_and_samples(a.data, a.path, a.subset, a.sentences,
                                                  precision=a.precision, task="aggressive_translation")
    return lib, model, task, samples
