from . import deep_shallow  # noqa: F401  (registers architectures)
