"""A checkpoint with its task and the first sentences of a data split, as the
diagnostic scripts (scripts/diagnostics/) measure them."""


def load_model_and_samples(data, path, subset, n, precision="float32", **overrides):
    """The model (eval), its task and the first ``n`` sentences of ``subset`` as batch-1 samples;
    ``precision="int8"``: the model quantized as ``--inference-precision int8`` does."""
    from fairseq import checkpoint_utils

    import fairseq_aggressive  # noqa: F401  (registers the task)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=dict(data=data, **overrides))
    task.load_dataset(subset)
    ds = task.dataset(subset)
    model = models[0].eval()
    if precision == "int8":
        from fairseq_aggressive.runtime.quantization import quantize_int8

        model = quantize_int8(model).eval()
    return model, task, [ds.collater([ds[i]]) for i in range(min(n, len(ds)))]


def translator_and_lines(model_dir, input_path, n, decoding="iad", int8=False, threads=None):
    """A :class:`~fairseq_aggressive.translator.Translator` of ``model_dir`` decoding as
    ``decoding`` (``int8``: its int8 copy; ``threads``: the engine's, else every usable CPU),
    the first ``n`` non-empty lines of ``input_path``, and each line's own output
    (``translate_static([s])``: the generator's batch of one, what a streamed or batched
    output must equal)."""
    import logging

    from fairseq_aggressive.streaming.options import translator_settings
    from fairseq_aggressive.translator import Translator

    settings = translator_settings({"decoding": decoding})
    if int8:
        settings["inference_precision"] = "int8"
    if threads:
        settings["native_threads"] = threads
    t = Translator.from_pretrained(model_dir, **settings)
    logging.getLogger("fairseq_aggressive").setLevel(logging.WARNING)
    with open(input_path, encoding="utf-8") as f:
        lines = [x.strip() for x in f if x.strip()][:n]
    return t, lines, [t.translate_static([s])[0] for s in lines]


def token_batches(tokens, src_dict, bsz):
    """fairseq samples of the source token tensors ``tokens`` in batches of ``bsz``, in their
    order (left-padded, as fairseq's translation batches are)."""
    import torch
    from fairseq.data import data_utils

    out = []
    for i in range(0, len(tokens), bsz):
        chunk = tokens[i: i + bsz]
        src = data_utils.collate_tokens(chunk, src_dict.pad(), src_dict.eos(), left_pad=True)
        out.append({"id": torch.arange(len(chunk)), "nsentences": len(chunk), "ntokens": sum(t.numel() for t in chunk),
                    "net_input": {"src_tokens": src, "src_lengths": torch.tensor([t.numel() for t in chunk])}})
    return out
