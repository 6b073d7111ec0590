"""The service's HTTP API, a Starlette app (:func:`build_app`):

- ``POST /v1/translate`` with ``{"text": "..."}`` answers ``{"text": "..."}``;
  with ``{"texts": ["...", ...]}`` it answers ``{"texts": [...]}``, in order.
- ``GET /health``: 200 ``{"status": "ok", "workers": N, "workers_total": W}``
  while a worker runs; 503 with ``loading``, ``shutting_down``, ``no_workers``
  or ``failed`` otherwise.
- ``GET /metrics``: the Prometheus metrics.

Every answer carries an ``X-Request-ID``; every error is answered as
``{"error": {"code": CODE, "message": "...", "request_id": "..."}}`` (the codes:
docs/serving.md), a 500 with the message ``internal error`` only (the log line
with the same request id says what failed).  With an API key every endpoint
but ``/health`` answers 401 without ``Authorization: Bearer KEY``.

Nothing a client sends is worked on here in proportion to its size: a body
over ``INLINE_BYTES`` is parsed, checked and tokenized on the ``prepare``
thread, and its answer encoded there."""
import asyncio
import hmac
import itertools
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ClientGone, Overloaded, RequestError, ShuttingDown
from .limits import Limits, check_content_type, parse_request, read_body
from .metrics import ServiceMetrics

logger = logging.getLogger("fairseq_aggressive.serving")

# bodies up to this many bytes are parsed and tokenized on the event loop (a bounded cost, and no
# thread hop for the usual request); larger ones on the prepare thread
INLINE_BYTES = 4096
_ids = itertools.count(1)
_PREFIX = os.urandom(3).hex()


def new_request_id() -> str:
    return f"{_PREFIX}-{next(_ids):x}"


def error_response(status: int, code: str, message: str, request_id: str = "", close: bool = False) -> JSONResponse:
    headers = {"X-Request-ID": request_id}
    if code == "queue_full":
        headers["Retry-After"] = "1"
    if close:
        headers["Connection"] = "close"
    body = {"error": {"code": code, "message": message, "request_id": request_id}}
    return JSONResponse(body, status_code=status, headers=headers)


def internal_error(request_id: str, what: str, exc: BaseException) -> JSONResponse:
    logger.error(f"request {request_id}: {what}: {type(exc).__name__}: {exc}",
                 exc_info=(type(exc), exc, exc.__traceback__))
    return error_response(500, "internal", "internal error", request_id)


_REFUSALS = (RequestError, Overloaded, ShuttingDown)


def build_app(backend, metrics: ServiceMetrics, limits: Limits = None, **limit_values) -> Starlette:
    """The ASGI app serving ``backend``: ``submit(texts, request_id)`` returns a
    request with a concurrent ``future`` of the outputs and ``cancel(reason)``
    (a bare Future is taken too); ``health()`` (or ``ready``).  Requests are
    bounded by ``limits`` (:class:`Limits`; or its fields as keywords)."""
    limits = limits or Limits(**limit_values)
    limits.check()
    prepare_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare")

    staged = hasattr(backend, "prepare_request")

    def submit(body: bytes, request_id: str):
        """Parsed, checked and (a backend that stages requests) tokenized, but not queued yet."""
        single, texts = parse_request(body, limits)
        return single, texts, backend.prepare_request(texts, request_id) if staged else \
            backend.submit(texts, request_id)

    def encode(single: bool, outputs) -> bytes:
        payload = {"text": outputs[0]} if single else {"texts": list(outputs)}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    async def translate(scope, receive, send) -> None:
        """POST /v1/translate, as a bare ASGI app (no framework between the socket and the decoders)."""
        start = time.perf_counter()
        rid = scope["fa.request_id"]
        headers = dict(scope["headers"])
        sentences, code, ticket, response, started = 0, None, None, None, False
        try:
            check_content_type(_text(headers.get(b"content-type")))
            body = await read_body(receive, _text(headers.get(b"content-length")), limits)
            metrics.observe_body(len(body))
            large = len(body) > INLINE_BYTES
            loop = asyncio.get_running_loop()
            if large:
                single, texts, ticket = await loop.run_in_executor(prepare_pool, submit, body, rid)
            else:
                single, texts, ticket = submit(body, rid)
            outputs = await _answer(receive, ticket, limits.request_timeout, backend.enqueue if staged else None)
            if len(outputs) != len(texts):
                raise RuntimeError(f"the backend answered {len(outputs)} outputs for {len(texts)} texts")
            content = await loop.run_in_executor(prepare_pool, encode, single, outputs) if large else \
                encode(single, outputs)
            sentences, started = len(outputs), True
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(content)).encode()),
                                    (b"x-request-id", rid.encode())]})
            await send({"type": "http.response.body", "body": content})
            return
        except _REFUSALS as e:
            code = e.code
            response = error_response(e.status, e.code, str(e) or _DEFAULT_MESSAGES.get(e.code, e.code), rid,
                                      e.close)
        except ClientGone:
            metrics.observe_cancel("client_closed")
            response = Response(status_code=499)  # (nobody reads it)
        except asyncio.CancelledError:
            # the drain ran out of time (--drain-timeout) and the server cancels what is still running: a
            # JSON 503 on a closing connection, not the bare 500 an exception out of the app would get; the
            # request's sentences stay with the backend, which counts them as unanswered as it stops (an
            # answer already begun has its connection closed)
            if started:
                raise
            code = "shutting_down"
            response = error_response(503, "shutting_down", "the server stopped before this request was answered "
                                      "(--drain-timeout)", rid, close=True)
        except _Timeout:
            code = "timeout"
            metrics.observe_cancel("timeout")
            response = error_response(504, "timeout", f"no answer within {limits.request_timeout:g} s "
                                      "(--request-timeout)", rid)
        except Exception as e:  # noqa: BLE001  (the server stays up; the log says what failed)
            code = "internal"
            response = internal_error(rid, "translate failed", e)
        finally:
            if code is not None:
                metrics.observe_error(code)
            metrics.observe_request("translate", time.perf_counter() - start, sentences)
        await response(scope, receive, send)

    async def health(request: Request) -> Response:
        state = backend.health() if hasattr(backend, "health") else \
            {"status": "ok" if getattr(backend, "ready", False) else "loading"}
        return JSONResponse(state, status_code=200 if state["status"] == "ok" else 503)

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, "bad_request")
        rid = request.scope.get("fa.request_id", "")
        response = error_response(exc.status_code, code, _HTTP_MESSAGES.get(code, str(exc.detail)), rid)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        return internal_error(request.scope.get("fa.request_id", ""), f"{request.method} {request.url.path}", exc)

    async def translate_elsewhere(request: Request) -> Response:  # (Guard sends every POST to translate)
        raise HTTPException(405, headers={"Allow": "POST"})

    app = Starlette(routes=[
        Route("/v1/translate", translate_elsewhere, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error, Exception: server_error})
    return Guard(app, translate, limits.api_key)


class _Timeout(Exception):
    pass


async def _answer(receive, ticket, timeout: float, enqueue=None):
    """The outputs of a request (``enqueue(ticket)`` queues it, where given);
    :class:`ClientGone` where its client leaves first, :class:`_Timeout` after
    ``timeout`` seconds (0: none); either way the request is cancelled (its
    sentences leave the queue and the batch).  Everything is set up before the
    request is queued, so that nothing is left to do on this thread while a
    worker starts on it."""
    future = getattr(ticket, "future", ticket)
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    why = []

    def end(reason):
        if not waiter.done():
            why.append(reason)
            waiter.set_result(None)

    watch = loop.create_task(_disconnected(receive))
    watch.add_done_callback(lambda t: t.cancelled() or end("client_closed"))
    timer = loop.call_later(timeout, end, "timeout") if timeout else None
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(end, "answered"))
    try:
        if enqueue is not None:
            enqueue(ticket)
        await waiter
    finally:
        watch.cancel()
        if timer is not None:
            timer.cancel()
    if why[0] == "answered":
        return future.result()
    cancel = getattr(ticket, "cancel", None)
    if cancel is not None:
        cancel(why[0])
    if why[0] == "client_closed":
        raise ClientGone()
    raise _Timeout()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _text(value):
    return value.decode("latin-1") if value is not None else None


class Guard:
    """The ASGI app in front: gives every HTTP request an id (its
    ``X-Request-ID``), with ``api_key`` answers 401 to any request but
    ``GET /health`` that lacks ``Authorization: Bearer <api_key>``, and hands
    ``POST /v1/translate`` to ``translate``, everything else to ``app``."""

    def __init__(self, app, translate, api_key=None):
        self.app, self.translate = app, translate
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = new_request_id()
        scope["fa.request_id"] = rid
        if scope["path"].startswith(("http://", "https://")):  # absolute-form (RFC 9112 3.2.2), which h11 leaves whole
            path = "/" + scope["path"].split("://", 1)[1].partition("/")[2]
            scope = dict(scope, path=path, raw_path=path.encode("latin-1", "replace"))
        if self.expected is not None and scope["path"] != "/health":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_response(401, "unauthorized", "this server needs Authorization: Bearer <key>", rid)
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
        if scope["path"] == "/v1/translate" and scope["method"] == "POST":
            try:
                return await self.translate(scope, receive, send)
            except Exception as e:  # noqa: BLE001  (translate answers its own errors; this is a last resort)
                return await internal_error(rid, "translate", e)(scope, receive, send)
        await self.app(scope, receive, send)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}
_HTTP_MESSAGES = {"not_found": "no such endpoint: POST /v1/translate, GET /health, GET /metrics",
                  "method_not_allowed": "this endpoint does not take that method"}
_DEFAULT_MESSAGES = {
    "queue_full": "the server's queue is full; retry later",
    "shutting_down": "the server is shutting down",
}
