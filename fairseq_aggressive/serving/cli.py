"""``fairseq-aggressive-serve MODEL_DIR``: the HTTP server.

    fairseq-aggressive-serve models/uagec-9x3 --port 8080 --workers 2 --native-threads 1

``POST /v1/translate`` with ``{"text": "..."}`` answers ``{"text": "..."}``
(``{"texts": [...]}`` answers ``{"texts": [...]}``), ``GET /health``, ``GET
/metrics`` (Prometheus).  Decoding options after the server's own are the
Translator's (``--decoding iad|greedy|gad|...``, ``--inference-precision
int8``, ``--native-threads N`` (per worker; default: the CPUs less one for
the HTTP side, shared by the workers), ``--max-draft-len N``, ``--draft-cost
off``, ...; default ``--decoding iad``).  SIGTERM or Ctrl-C: no new requests, every
request in flight answered, exit 0.  Details: docs/serving.md.
"""
import argparse
import logging
import sys


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def decoding_settings(rest):
    """``--name value`` pairs (and bare ``--flag``) as Translator settings."""
    settings, i = {}, 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise SystemExit(f"fairseq-aggressive-serve: unexpected argument {arg!r}")
        key, eq, val = arg[2:].partition("=")
        if eq:
            i += 1
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            val, i = rest[i + 1], i + 2
        else:
            val, i = "true", i + 1
        settings[key.replace("-", "_")] = _value(val)
    return settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairseq-aggressive-serve", description=__doc__.split("\n\n")[0],
        epilog="Other --options are decoding settings as Translator takes them (--decoding, "
               "--inference-precision, --native-threads, --max-draft-len, --draft-cost, ...).")
    p.add_argument("model_dir", help="a model directory: model.pt, dict.*.txt, bpe.codes, MODEL.json")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: a free port (printed)")
    p.add_argument("--workers", type=int, default=1, help="decoders on one copy of the weights (default 1)")
    p.add_argument("--max-batch", type=int, default=32, help="sentences one worker decodes at once (default 32)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="sentences that may wait; beyond, requests get 503 (default 256, 0: no limit)")
    p.add_argument("--max-input-tokens", type=int, default=256,
                   help="longest sentence after BPE, in tokens; longer ones get 413 (default 256)")
    p.add_argument("--max-input-chars", type=int, default=10000,
                   help="longest text in characters, checked before tokenizing (default 10000)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="on SIGTERM, seconds to finish the requests in flight (default 60)")
    return p


def main(argv=None) -> int:
    args, rest = parser().parse_known_args(argv)
    settings = decoding_settings(rest)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    from .app import build_app
    from .backend import DecodeBackend
    from .metrics import ServiceMetrics
    from .server import run_server

    metrics = ServiceMetrics()
    try:
        backend = DecodeBackend(args.model_dir, workers=args.workers, max_queue=args.max_queue,
                                max_input_tokens=args.max_input_tokens, max_batch=args.max_batch, metrics=metrics,
                                **settings)
    except (ValueError, OSError) as e:
        print(f"fairseq-aggressive-serve: {e}", file=sys.stderr)
        return 2
    print(f"model {args.model_dir}: {backend.mode} batching, {len(backend.workers)} worker(s), "
          f"settings {settings or 'default'}", flush=True)
    app = build_app(backend, metrics, max_input_chars=args.max_input_chars)

    def on_shutdown():
        left = backend.close(args.drain_timeout)
        print(f"stopped: {left} sentence(s) unanswered", flush=True)

    return run_server(app, args.host, args.port, on_shutdown, timeout_graceful_shutdown=args.drain_timeout)


def cli_main():
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
