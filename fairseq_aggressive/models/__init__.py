from . import block_nat, blockwise, deep_shallow  # noqa: F401  (registers models and architectures)
