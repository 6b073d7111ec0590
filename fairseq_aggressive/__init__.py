"""fairseq-aggressive: aggressive (draft -> verify -> accept) decoding for fairseq.

Load with ``--user-dir fairseq_aggressive`` (or ``import fairseq_aggressive``).
"""
from .compat import patch_checkpoint_loading

patch_checkpoint_loading()

from . import criterions, models, tasks  # noqa: E402,F401  (register components)

__version__ = "0.1.0"
