from . import glat_block_loss  # noqa: F401  (registers criteria)
