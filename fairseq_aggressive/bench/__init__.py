"""``fairseq-aggressive-bench``: decoding modes side by side in one run, against
CTranslate2's fastest configuration (:mod:`.cli` describes the command).

``cli`` (the command), ``options`` (its flags), ``modes`` (the mode names),
``run`` (decoding every mode), ``report`` (the result, tables, plots),
``workers`` (W decoders at once), ``ct2`` and ``ct2_worker`` (CTranslate2 in a
process of its own), ``load`` (busy processes beside a run); ``serve``
(``fairseq-aggressive-bench-serve``: the HTTP server under loopback load)."""
__all__ = ["cli_main", "main"]


def __getattr__(name):
    if name in __all__:  # (the command loads torch and fairseq; ``load`` and ``ct2`` need neither)
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
