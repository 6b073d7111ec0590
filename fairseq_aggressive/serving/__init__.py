"""Translations served: the HTTP service, a Starlette app (app.py) that
validates requests and hands them to a backend (backend.py, scheduler.py),
the errors both share (errors.py), its Prometheus metrics (metrics.py), and
uvicorn run with a graceful drain (server.py); and files of sentences
(translate_cli.py: ``fairseq-aggressive-translate``).

Nothing is imported here: the HTTP submodules need the ``serve`` extra
(starlette, uvicorn, prometheus_client)."""
