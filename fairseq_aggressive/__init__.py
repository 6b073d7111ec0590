"""fairseq-aggressive: aggressive (draft -> verify -> accept) decoding for fairseq.

Load with ``--user-dir fairseq_aggressive`` (or ``import fairseq_aggressive``, before or
after fairseq's own imports: the components register with fairseq when it is loaded,
:mod:`.registration`).
"""
from .registration import register_with_fairseq

register_with_fairseq()

__version__ = "0.1.0"


def __getattr__(name):
    if name == "Translator":  # (loads torch and fairseq: only when asked for)
        from .translator import Translator

        return Translator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
