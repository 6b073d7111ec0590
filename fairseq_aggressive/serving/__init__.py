"""The HTTP service: a Starlette app (app.py) that validates requests and hands
them to a backend, the errors both share (errors.py), its Prometheus metrics
(metrics.py), and uvicorn run with a graceful drain (server.py).

Nothing is imported here: the submodules need the ``serve`` extra
(starlette, uvicorn, prometheus_client)."""
