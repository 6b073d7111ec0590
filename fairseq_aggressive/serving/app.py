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

    def submit(body: bytes, request_id: str):
        single, texts = parse_request(body, limits)
        return single, texts, backend.submit(texts, request_id)

    def encode(single: bool, outputs) -> bytes:
        payload = {"text": outputs[0]} if single else {"texts": list(outputs)}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    async def translate(request: Request) -> Response:
        start = time.perf_counter()
        rid = request.scope.get("fa.request_id") or new_request_id()
        sentences, code, ticket = 0, None, None
        try:
            check_content_type(request.headers.get("content-type"))
            body = await read_body(request, limits)
            metrics.observe_body(len(body))
            large = len(body) > INLINE_BYTES
            loop = asyncio.get_running_loop()
            if large:
                single, texts, ticket = await loop.run_in_executor(prepare_pool, submit, body, rid)
            else:
                single, texts, ticket = submit(body, rid)
            outputs = await _answer(request, ticket, limits.request_timeout)
            if len(outputs) != len(texts):
                raise RuntimeError(f"the backend answered {len(outputs)} outputs for {len(texts)} texts")
            content = await loop.run_in_executor(prepare_pool, encode, single, outputs) if large else \
                encode(single, outputs)
            sentences = len(outputs)
            return Response(content, media_type="application/json", headers={"X-Request-ID": rid})
        except _REFUSALS as e:
            code = e.code
            return error_response(e.status, e.code, str(e) or _DEFAULT_MESSAGES.get(e.code, e.code), rid, e.close)
        except ClientGone:
            metrics.observe_cancel("client_closed")
            return Response(status_code=499)  # (nobody reads it)
        except _Timeout:
            code = "timeout"
            metrics.observe_cancel("timeout")
            return error_response(504, "timeout", f"no answer within {limits.request_timeout:g} s "
                                  "(--request-timeout)", rid)
        except Exception as e:  # noqa: BLE001  (the server stays up; the log says what failed)
            code = "internal"
            return internal_error(rid, "translate failed", e)
        finally:
            if code is not None:
                metrics.observe_error(code)
            metrics.observe_request("translate", time.perf_counter() - start, sentences)

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

    app = Starlette(routes=[
        Route("/v1/translate", translate, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error, Exception: server_error})
    return Guard(app, limits.api_key)


class _Timeout(Exception):
    pass


async def _answer(request: Request, ticket, timeout: float):
    """The outputs of a submitted request; :class:`ClientGone` where its client
    leaves first, :class:`_Timeout` after ``timeout`` seconds (0: none); either
    way the request is cancelled (its sentences leave the queue and the batch)."""
    future = getattr(ticket, "future", ticket)
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def resolved(f):
        loop.call_soon_threadsafe(_copy_result, f, waiter)

    future.add_done_callback(resolved)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((waiter, watch), timeout=timeout or None, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if waiter in done:
        return waiter.result()
    cancel = getattr(ticket, "cancel", None)
    if watch in done:
        if cancel is not None:
            cancel("client_closed")
        raise ClientGone()
    if cancel is not None:
        cancel("timeout")
    raise _Timeout()


def _copy_result(source, waiter) -> None:
    if waiter.done():
        return
    if source.cancelled():
        waiter.set_exception(RuntimeError("the request was cancelled"))
    elif source.exception() is not None:
        waiter.set_exception(source.exception())
    else:
        waiter.set_result(source.result())


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Guard:
    """ASGI middleware around the app: gives every HTTP request an id (its
    ``X-Request-ID``) and, with ``api_key``, answers 401 to any request but
    ``GET /health`` that lacks ``Authorization: Bearer <api_key>``."""

    def __init__(self, app, api_key=None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = new_request_id()
        scope["fa.request_id"] = rid
        if self.expected is not None and scope["path"] != "/health":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_response(401, "unauthorized", "this server needs Authorization: Bearer <key>", rid)
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}
_HTTP_MESSAGES = {"not_found": "no such endpoint: POST /v1/translate, GET /health, GET /metrics",
                  "method_not_allowed": "this endpoint does not take that method"}
_DEFAULT_MESSAGES = {
    "queue_full": "the server's queue is full; retry later",
    "shutting_down": "the server is shutting down",
}
