from . import blockwise_cross_entropy, glat_block_loss  # noqa: F401  (registers criteria)
