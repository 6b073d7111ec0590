"""``fairseq-aggressive-serve MODEL_DIR``: the HTTP server.

    fairseq-aggressive-serve models/uagec-9x3 --port 8080 --workers 2 --native-threads 1

``POST /v1/translate`` with ``{"text": "..."}`` answers ``{"text": "..."}``
(``{"texts": [...]}`` answers ``{"texts": [...]}``), ``GET /health``, ``GET
/metrics`` (Prometheus).  SIGTERM or Ctrl-C: no new requests, every request in
flight answered; the exit status is 0 when every accepted sentence was
answered, 1 when some were not, 3 when the workers kept dying.  Details:
docs/serving.md.
"""
import argparse
import logging
import os
import sys

from ..streaming.options import HelpFormatter, add_decoding_arguments, decoding_settings

API_KEY_ENV = "FAIRSEQ_AGGRESSIVE_API_KEY"
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairseq-aggressive-serve", description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter)
    p.add_argument("model_dir", help="a model directory: model.pt, dict.*.txt, bpe.codes, MODEL.json")
    s = p.add_argument_group("the server")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; keep 127.0.0.1 and put a reverse proxy with TLS in front to "
                        "serve other machines (docs/serving.md)")
    s.add_argument("--port", type=int, default=8080, help="TCP port; 0: a free one (printed)")
    s.add_argument("--workers", type=int, default=1, help="decoders on one copy of the weights")
    s.add_argument("--max-batch", type=int, default=32, help="sentences one worker decodes at once")
    s.add_argument("--max-queue", type=int, default=256,
                   help="sentences that may wait; beyond, requests get 503 queue_full (0: no limit)")
    s.add_argument("--api-key", default=None,
                   help=f"every endpoint but /health answers 401 without 'Authorization: Bearer KEY' (or set "
                        f"{API_KEY_ENV}) (default: none)")
    s.add_argument("--drain-timeout", type=float, default=60.0,
                   help="on SIGTERM, seconds in all to answer the requests in flight")
    lim = p.add_argument_group("bounds on requests and connections")
    lim.add_argument("--max-input-tokens", type=int, default=256,
                     help="longest sentence after BPE, in tokens; longer ones get 413")
    lim.add_argument("--max-input-chars", type=int, default=10000,
                     help="longest text in characters, checked before tokenizing (413)")
    lim.add_argument("--max-word-chars", type=int, default=200, help="longest word in characters (413)")
    lim.add_argument("--max-batch-texts", type=int, default=64, help="most texts in one request (413)")
    lim.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (413)")
    lim.add_argument("--request-timeout", type=float, default=60.0,
                     help="seconds from a request's body to its answer, else 504 and its sentences are dropped "
                          "(0: none)")
    lim.add_argument("--body-timeout", type=float, default=30.0,
                     help="seconds to receive a request's body, else 408")
    lim.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds to receive a request's headers, else 408 and the connection closes")
    lim.add_argument("--max-connections", type=int, default=256,
                     help="open connections; one more is answered 503 and closed (0: no limit)")
    p.set_defaults(decoding_names=add_decoding_arguments(p))
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = decoding_settings(args, args.decoding_names)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    logging.getLogger("fairseq").setLevel(logging.WARNING)  # (its whole configuration at load, at INFO)
    from .app import build_app
    from .backend import DecodeBackend
    from .limits import Limits
    from .metrics import ServiceMetrics
    from .server import run_server

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    limits = Limits(max_input_chars=args.max_input_chars, max_body_bytes=args.max_body_bytes,
                    max_batch_texts=args.max_batch_texts, max_word_chars=args.max_word_chars,
                    body_timeout=args.body_timeout, request_timeout=args.request_timeout, api_key=api_key)
    metrics = ServiceMetrics()
    try:
        limits.check()
        if args.header_timeout <= 0 or args.max_connections < 0 or args.drain_timeout < 0:
            raise ValueError("--header-timeout must be > 0, --max-connections and --drain-timeout >= 0")
        backend = DecodeBackend(args.model_dir, workers=args.workers, max_queue=args.max_queue,
                                max_input_tokens=args.max_input_tokens, max_batch=args.max_batch, metrics=metrics,
                                **settings)
    except (ValueError, OSError) as e:
        print(f"fairseq-aggressive-serve: {e}", file=sys.stderr)
        return 2
    print(f"model {args.model_dir}: {backend.mode} batching, {len(backend.workers)} worker(s), "
          f"settings {settings or 'default'}{', API key required' if api_key else ''}", flush=True)
    app = build_app(backend, metrics, limits)

    def on_shutdown(seconds_left: float) -> None:
        left = backend.close(seconds_left)
        print(f"stopped: {left} sentence(s) unanswered", flush=True)
        if left:
            logging.getLogger("fairseq_aggressive.serving").error(
                f"{left} accepted sentence(s) went unanswered: the drain ran out of time (--drain-timeout)")
        state["left"] = left

    state = {"left": 0}
    code = run_server(app, args.host, args.port, on_shutdown, timeout_graceful_shutdown=args.drain_timeout,
                      on_signal=backend.begin_drain, should_stop=lambda: backend.failed,
                      max_connections=args.max_connections, header_timeout=args.header_timeout)
    if code:
        return code
    if backend.failed:
        print("fairseq-aggressive-serve: the workers kept dying; stopped", file=sys.stderr)
        return 3
    return 1 if state["left"] else 0


def cli_main():
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
