"""Whole inputs through the engine's running batch: :class:`RunningDecoder`
(what a Translator's decoding needs of a running batch: its settings, a
sentence's tokens and length limit), :func:`stream` (sentences in, outputs
out in order, a row that ends refilled at the next pass boundary), which
``Translator.translate_batch``, ``fairseq-aggressive-translate``
(:mod:`fairseq_aggressive.serving.translate_cli`) and the server's workers use."""
from .decoder import Prepared, RunningDecoder, TooLong
from .stream import stream

__all__ = ["Prepared", "RunningDecoder", "TooLong", "stream"]
