from . import block_nat, deep_shallow  # noqa: F401  (registers models and architectures)
