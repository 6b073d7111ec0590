"""Hugging Face checkpoints imported into this package's model directories
(:func:`import_hf`, ``fairseq-aggressive-import-hf``): the ``[hf]`` extra."""
from .convert import ConversionError, from_hf_ids, import_hf, to_hf_ids

__all__ = ["ConversionError", "import_hf", "from_hf_ids", "to_hf_ids"]
