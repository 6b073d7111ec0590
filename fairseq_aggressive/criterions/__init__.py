from . import blockwise_cross_entropy, feature_ar_loss, glat_block_loss  # noqa: F401  (registers criteria)
