"""Evaluation tools for GEC and MT outputs.

Sub-modules (import them explicitly; this package imports nothing heavy):

* :mod:`fairseq_aggressive.evaluation.m2` -- MaxMatch (M2) scorer
  (console script ``fairseq-aggressive-m2``).
* :mod:`fairseq_aggressive.evaluation.parallel_to_m2` /
  :mod:`fairseq_aggressive.evaluation.m2_to_parallel` -- converters between
  parallel text and M2 gold annotations.
* :mod:`fairseq_aggressive.evaluation.gleu` -- GLEU for GEC
  (console script ``fairseq-aggressive-gleu``).
* :mod:`fairseq_aggressive.evaluation.bleu` -- sacreBLEU / WMT14 compound-split
  BLEU (console script ``fairseq-aggressive-bleu``).
* :mod:`fairseq_aggressive.evaluation.generate_output` -- reads
  ``fairseq-generate`` output (S-/T-/H- lines by sentence id).
* :mod:`fairseq_aggressive.evaluation.errant_eval` -- optional ERRANT (BEA-19)
  wrapper, needs the ``gec`` extra (``pip install fairseq-aggressive[gec]``).
"""

__all__ = ["m2", "gleu", "bleu", "parallel_to_m2", "m2_to_parallel", "errant_eval", "generate_output"]


def read_lines(path):
    """The lines of a UTF-8 text file, without line ends (shared by the evaluation CLIs)."""
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
