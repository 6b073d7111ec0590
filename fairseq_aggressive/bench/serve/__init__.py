"""``fairseq-aggressive-bench-serve MODEL_DIR SENTENCES``: the HTTP server
under loopback load, beside CTranslate2 behind the same batching window
(:mod:`.cli` describes the command).

``cli`` (the command: its flags, the run, the exit status), ``run`` (the
reference, CTranslate2's configuration, one system's run), ``phases`` (the
latency, capacity and open-loop phases, every answer checked), ``client``
(the asyncio HTTP client, percentiles, Poisson schedules), ``servers``
(server processes: command lines, start, ``serving on``, stop), ``window``
(the batching-window server of ``static`` and ``ct2``), ``static_server`` and
``ct2_server`` (what those two decode with), ``report`` (tables, plot).
``fairseq_aggressive.bench.serve_bench`` keeps the command's old module name."""
from .cli import cli_main, main

__all__ = ["cli_main", "main"]
