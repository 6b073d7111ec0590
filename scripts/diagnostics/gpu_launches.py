"""Where a decoder pass's time goes on a GPU: fairseq's greedy (one step per token) against IAD
(one pass per draft) on a checkpoint, batch 1, the first N test sentences. Per pass: wall time
(the device synchronised around each sentence), CUDA kernels launched and the GPU's busy time
(the kernels' summed durations, torch.profiler). Busy time far below wall time: the pass is
bound by launching kernels from Python, not by the GPU.

    python scripts/diagnostics/gpu_launches.py MODEL_DIR DATA_BIN [--sentences 30] [--fp16] [--sdpa-backends]
        [--top-ops N]

``--sdpa-backends`` also times IAD with the verifier's attention held to each of torch's
scaled-dot-product-attention backends in turn (the verifier's own choice, torch's, flash,
memory-efficient, cuDNN, math), those that cannot run the call reported as such.
``--top-ops N``: the N operators of an IAD decode with the most host time, and their GPU time.

MODEL_DIR holds model.pt and its dictionaries; DATA_BIN a binarized test split with the same
dictionaries."""
import argparse
import time

import torch


def decode(gen, model, batches):
    for sample in batches:
        gen.generate([model], sample)


def timed(gen, model, batches):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for sample in batches:
        gen.generate([model], sample)
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernels(gen, model, batches):
    """(kernel launches, summed kernel microseconds) while decoding ``batches``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decode(gen, model, batches)
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return len(evs), sum(getattr(e, "device_time", None) or e.cuda_time for e in evs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("data_bin")
    ap.add_argument("--sentences", type=int, default=30)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--sdpa-backends", action="store_true")
    ap.add_argument("--top-ops", type=int, default=0)
    args = ap.parse_args(argv)
    from fairseq import checkpoint_utils, utils
    from fairseq.sequence_generator import SequenceGenerator

    import fairseq_aggressive  # noqa: F401
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [f"{args.model_dir}/model.pt"], arg_overrides={"data": args.data_bin})
    model = models[0].cuda().eval()
    if args.fp16:
        model = model.half()
    task.load_dataset("test")
    ds = task.dataset("test")
    batches = [utils.move_to_cuda(ds.collater([ds[i]])) for i in range(min(args.sentences, len(ds)))]
    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    lens = dict(max_len_a=1.2, max_len_b=10)
    greedy = SequenceGenerator([model], tgt_d, beam_size=1, **lens)
    iad = build_generator([model], tgt_d, InputCopyDrafter(src_d, tgt_d), engine="torch", **lens)
    with torch.no_grad():
        decode(greedy, model, batches[:5])
        decode(iad, model, batches[:5])
        steps = sum(len(greedy.generate([model], b)[0][0]["tokens"]) for b in batches)
        iad.stats.__init__()
        decode(iad, model, batches)
        passes = iad.stats.passes
        rows = []
        for name, gen, n in (("greedy (fairseq)", greedy, steps), ("iad (torch verifier)", iad, passes)):
            wall = timed(gen, model, batches)
            k, busy_us = kernels(gen, model, batches)
            rows.append((name, n, 1000 * wall / len(batches), 1000 * wall / n, k / n, busy_us / 1000 / n))
    print(f"{torch.cuda.get_device_name(0)}, {next(model.parameters()).dtype}, {len(batches)} sentences, batch 1")
    print("| decoding | passes | ms/sentence | ms/pass | kernels/pass | GPU busy ms/pass |")
    print("|---|---|---|---|---|---|")
    for name, n, ms_sent, ms_pass, k, busy in rows:
        print(f"| {name} | {n} | {ms_sent:.1f} | {ms_pass:.2f} | {k:.0f} | {busy:.3f} |")
    if args.top_ops:
        print_top_ops(iad, model, batches[: min(8, len(batches))], args.top_ops)
    if args.sdpa_backends:
        print_backends(iad, model, batches, passes)


def print_top_ops(gen, model, batches, n):
    """The ``n`` operators with the most host time over an IAD decode of ``batches``."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decode(gen, model, batches)
        torch.cuda.synchronize()
    print(f"IAD, {len(batches)} sentences: operators by host time")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=n, max_name_column_width=60))


def print_backends(gen, model, batches, passes):
    """IAD's time per pass with the verifier's attention held to each SDPA backend (warm-up first)."""
    from torch.nn.attention import SDPBackend

    cached = gen.verifier.decoder  # the CachedDecoderVerifier under the torch verifier
    print("| attention backend | ms/pass (warm) |")
    print("|---|---|")
    for name in ("the verifier's choice", "torch's choice", "FLASH_ATTENTION", "EFFICIENT_ATTENTION",
                 "CUDNN_ATTENTION", "MATH"):
        if name == "the verifier's choice":
            cached.attention_backends = "auto"
        elif name == "torch's choice":
            cached.attention_backends = None
        elif getattr(SDPBackend, name, None) is None:
            print(f"| {name} | not in this torch |")
            continue
        else:
            cached.attention_backends = [getattr(SDPBackend, name)]
        try:
            with torch.no_grad():
                decode(gen, model, batches[:5])
                wall = timed(gen, model, batches)
            print(f"| {name} | {1000 * wall / passes:.2f} |")
        except RuntimeError as e:  # the backend cannot run this call (dtype, mask, head size)
            print(f"| {name} | cannot run it: {str(e).splitlines()[0][:80]} |")
    cached.attention_backends = "auto"


if __name__ == "__main__":
    main()
