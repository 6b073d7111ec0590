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
