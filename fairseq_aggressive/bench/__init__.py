"""``fairseq-aggressive-bench``: decoding modes side by side in one run, against
CTranslate2's fastest configuration (:mod:`.cli` describes the command).

``cli`` (the command), ``options`` (its flags), ``modes`` (the mode names),
``run`` (decoding every mode), ``report`` (the result, tables, plots),
``workers`` (W decoders at once), ``ct2`` and ``ct2_worker`` (CTranslate2 in a
process of its own), ``load`` (busy processes beside a run); ``serve``
(``fairseq-aggressive-bench-serve``: the HTTP server under loopback load)."""
from .cli import cli_main, main

__all__ = ["cli_main", "main"]
