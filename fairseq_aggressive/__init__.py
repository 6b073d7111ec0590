"""fairseq-aggressive: aggressive (draft -> verify -> accept) decoding for fairseq.

Load with ``--user-dir fairseq_aggressive`` (or ``import fairseq_aggressive``).
"""
from .compat import patch_checkpoint_loading
from .distributed import patch_cpu_distributed

patch_checkpoint_loading()
patch_cpu_distributed()  # fairseq's distributed training on CPU processes (GPU runs untouched)

from . import criterions, models, tasks  # noqa: E402,F401  (register components)
from .hf import bpe as _hf_bpe  # noqa: E402,F401  (--bpe hf_sentencepiece)
from .translator import Translator  # noqa: E402,F401

__version__ = "0.1.0"
