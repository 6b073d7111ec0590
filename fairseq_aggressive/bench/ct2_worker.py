"""CTranslate2 in a process of its own (run as a script, never imported by the
torch process: CTranslate2's OpenMP runtime and torch's slow each other down
by 14-34x when both live in one process).

    python ct2_worker.py convert CKPT DATA_DIR USER_DIR OUT_DIR
    python ct2_worker.py decode MODEL_DIR < request.json > result.json
    python ct2_worker.py serve MODEL_DIR < request.json > result.json
    python ct2_worker.py types > types.json

``convert`` writes a CTranslate2 model with CTranslate2's own fairseq
converter (float32 weights; int8 is chosen at load time with
``compute_type``); of a ``transformer_blockwise`` checkpoint, its base
Transformer (the model its greedy search decodes; the heads are proposals);
of a model imported from transformers, the checkpoint it was imported from
with CTranslate2's transformers converter.  ``decode`` reads ``{"compute_type", "threads", "warmup",
"batches": [{"tokens": [[str]], "max_len": int}]}``, decodes every batch
greedily (beam 1), first ``warmup`` batches untimed, then all batches timed one
by one, and writes ``{"batches": [{"seconds": float, "hyps": [[str]]}],
"version": str}``.

``serve`` reads ``{"compute_type", "workers", "threads", "warmup", "shards":
[[{"tokens": [[str]], "max_len": int}]]}``: one translator with
``inter_threads=workers`` (``intra_threads=threads``) and one client thread per
shard, all started at once, each sending its shard's batches one by one, as a
service with that many workers does; writes ``{"wall": float, "shards":
[[{"seconds": float, "hyps": [[str]]}]], "version": str}``.

``types`` writes the compute types CTranslate2 supports on this CPU (a JSON list).

This file imports only the standard library and ctranslate2 (for ``decode`` and ``serve``).
"""
import json
import sys
import time


BASE_ARCHS = {"transformer_blockwise": "transformer", "transformer_blockwise_big": "transformer_vaswani_wmt_en_de_big"}


def base_checkpoint(ckpt, tmp_dir):
    """``ckpt``, or for a blockwise model a copy in ``tmp_dir`` without its heads as its base
    Transformer's architecture (CTranslate2 converts stock architectures only)."""
    import os

    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    holders = [h for h in (state.get("args"), (state.get("cfg") or {}).get("model")) if h is not None]
    archs = {getattr(h, "arch", None) for h in holders}
    if not archs & set(BASE_ARCHS):
        return ckpt
    for h in holders:
        for key in ("arch", "_name"):
            if getattr(h, key, None) in BASE_ARCHS:
                setattr(h, key, BASE_ARCHS[getattr(h, key)])
    state["model"] = {k: v for k, v in state["model"].items() if not k.startswith("blockwise_heads.")}
    state.pop("last_optimizer_state", None)
    os.makedirs(tmp_dir, exist_ok=True)
    path = os.path.join(tmp_dir, "base.pt")
    torch.save(state, path)
    return path


def imported_from(ckpt):
    """The transformers checkpoint directory an imported model (docs/hugging-face.md) was
    converted from, as its MODEL.json records it, or None for a fairseq-trained model."""
    import os

    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(ckpt)), "MODEL.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    source = meta.get("imported_from") if meta.get("arch") == "hf_transformer" else None
    if source is None:
        return None
    if not os.path.isfile(os.path.join(source.get("path", ""), "config.json")):
        raise SystemExit(f"the transformers checkpoint {ckpt} was imported from is not at {source.get('path')}: "
                         "CTranslate2 converts the imported model from it (ct2-transformers-converter)")
    return source["path"]


def convert(ckpt, data_dir, user_dir, out_dir):
    import shutil

    from ctranslate2.converters import FairseqConverter, TransformersConverter

    hf_dir = imported_from(ckpt)
    if hf_dir is not None:  # the same checkpoint through CTranslate2's own transformers converter
        TransformersConverter(hf_dir).convert(out_dir, quantization=None, force=True)
        return
    tmp = out_dir.rstrip("/") + ".base"
    try:
        # our own checkpoints carry an argparse Namespace: trusted, so unpickled in full
        FairseqConverter(base_checkpoint(ckpt, tmp), data_dir, user_dir=user_dir,
                         unsafe_deserialization=True).convert(out_dir, quantization=None, force=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def translate(translator, batch, workers=1):
    """The best hypotheses (token strings) of one batch, greedy or with the batch's
    ``beam``, fairseq's length cap, each starting with the batch's ``prefix`` if any;
    ``workers`` > 1: the batch split into as many parts, decoded at once on the
    translator's workers (CTranslate2 sorts a batch by length before it splits it)."""
    prefix = batch.get("prefix")
    n = len(batch["tokens"])
    res = translator.translate_batch(
        batch["tokens"], max_batch_size=-(-n // workers) if workers > 1 else 0,
        beam_size=batch.get("beam", 1), max_decoding_length=batch["max_len"],
        min_decoding_length=batch.get("min_len", 1), return_scores=False,
        target_prefix=[prefix] * len(batch["tokens"]) if prefix else None,
    )
    return [r.hypotheses[0] for r in res]


def decode(model_dir, request):
    import ctranslate2

    workers = request.get("workers", 1)
    translator = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=request["compute_type"],
        inter_threads=workers, intra_threads=request["threads"],
    )

    batches = request["batches"]
    for batch in batches[: request.get("warmup", 0)]:
        translate(translator, batch, workers)
    out = []
    for batch in batches:
        t0 = time.perf_counter()
        hyps = translate(translator, batch, workers)
        out.append({"seconds": time.perf_counter() - t0, "hyps": hyps})
    return {"batches": out, "version": ctranslate2.__version__}


def serve(model_dir, request):
    import threading

    import ctranslate2

    shards = request["shards"]
    translator = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=request["compute_type"],
        inter_threads=request["workers"], intra_threads=request["threads"],
    )

    for shard in shards:
        for batch in shard[: request.get("warmup", 0)]:
            translate(translator, batch)
    out = [[] for _ in shards]
    start = threading.Barrier(len(shards) + 1)

    def client(k):
        start.wait()
        for batch in shards[k]:
            t0 = time.perf_counter()
            hyps = translate(translator, batch)
            out[k].append({"seconds": time.perf_counter() - t0, "hyps": hyps})

    clients = [threading.Thread(target=client, args=(k,)) for k in range(len(shards))]
    for c in clients:
        c.start()
    start.wait()
    t0 = time.perf_counter()
    for c in clients:
        c.join()
    import resource

    return {"wall": time.perf_counter() - t0, "shards": out, "version": ctranslate2.__version__,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def types():
    import ctranslate2

    return sorted(ctranslate2.get_supported_compute_types("cpu"))


def main(argv):
    if argv == ["types"]:
        json.dump(types(), sys.stdout)
        return 0
    if len(argv) == 5 and argv[0] == "convert":
        convert(*argv[1:])
        return 0
    if len(argv) == 2 and argv[0] in ("decode", "serve"):
        run = decode if argv[0] == "decode" else serve
        json.dump(run(argv[1], json.load(sys.stdin)), sys.stdout)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
