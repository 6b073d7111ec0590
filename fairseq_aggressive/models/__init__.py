from . import block_nat, blockwise, deep_shallow, hf_transformer  # noqa: F401  (registers models and architectures)
