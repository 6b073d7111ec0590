"""The service's HTTP API, a Starlette app (:func:`build_app`):

- ``POST /v1/translate`` with ``{"text": "..."}`` answers ``{"text": "..."}``;
  with ``{"texts": ["...", ...]}`` it answers ``{"texts": [...]}``, in order.
- ``GET /health``: 200 ``{"status": "ok"}`` once the backend is ready, else
  503 ``{"status": "loading"}``.
- ``GET /metrics``: the Prometheus metrics.

Every error is answered as ``{"error": {"code": CODE, "message": "..."}}``:
400 ``bad_json`` (the body is not JSON), 400 ``missing_field`` (not an object
with exactly one of ``text`` and ``texts``), 400 ``not_a_string``, 400
``empty_text`` (an empty or whitespace-only text, or no texts), 400
``nul_byte``, 413 ``too_long`` (over ``max_input_chars`` characters, or the
backend's token limit), 503 ``queue_full`` and ``shutting_down``, and 500
``internal`` for anything else the backend raises (the server stays up)."""
import asyncio
import json
import logging
import time
from typing import List, Tuple

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import Overloaded, RequestError, ShuttingDown
from .metrics import ServiceMetrics

logger = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def parse_request(body: bytes, max_input_chars: int) -> Tuple[bool, List[str]]:
    """The texts of a translate request's body, and whether it sent one
    ``text`` (not a list); raises :class:`RequestError` naming what is wrong."""
    try:
        payload = json.loads(body)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise RequestError(f"the body is not valid JSON: {e}", code="bad_json") from None
    if not isinstance(payload, dict):
        raise RequestError(f'the body must be a JSON object with "text" (a string) or "texts" (a list of '
                           f"strings), not a JSON {_json_type(payload)}", code="missing_field")
    if ("text" in payload) == ("texts" in payload):
        which = "both" if "text" in payload else "neither"
        raise RequestError(f'the body must have exactly one of "text" (a string) and "texts" (a list of strings); '
                           f"it has {which}", code="missing_field")
    if "text" in payload:
        single, texts, names = True, [payload["text"]], ["text"]
        if not isinstance(payload["text"], str):
            raise RequestError(f'"text" must be a string, not a JSON {_json_type(payload["text"])}',
                               code="not_a_string")
    else:
        single, texts = False, payload["texts"]
        if not isinstance(texts, list):
            raise RequestError(f'"texts" must be a list of strings, not a JSON {_json_type(texts)}',
                               code="not_a_string")
        if not texts:
            raise RequestError('"texts" is empty: send at least one text', code="empty_text")
        names = [f"texts[{i}]" for i in range(len(texts))]
    for name, text in zip(names, texts):
        if not isinstance(text, str):
            raise RequestError(f"{name} must be a string, not a JSON {_json_type(text)}", code="not_a_string")
        if not text.strip():
            raise RequestError(f"{name} is empty or whitespace only", code="empty_text")
        if "\x00" in text:
            raise RequestError(f"{name} contains a NUL byte (\\u0000)", code="nul_byte")
        if len(text) > max_input_chars:
            raise RequestError(f"{name} has {len(text)} characters; the limit is {max_input_chars}",
                               code="too_long", status=413)
    return single, texts


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def build_app(backend, metrics: ServiceMetrics, max_input_chars: int = 10000) -> Starlette:
    """The ASGI app serving ``backend`` (``ready``, and ``submit(texts)`` returning a
    concurrent Future of the outputs), recording every translate request in ``metrics``."""

    async def translate(request: Request) -> Response:
        start = time.perf_counter()
        sentences = 0
        code = None
        try:
            single, texts = parse_request(await request.body(), max_input_chars)
            outputs = await asyncio.wrap_future(backend.submit(texts))
            if len(outputs) != len(texts):
                raise RuntimeError(f"the backend answered {len(outputs)} outputs for {len(texts)} texts")
            sentences = len(outputs)
            return JSONResponse({"text": outputs[0]} if single else {"texts": list(outputs)})
        except (RequestError, Overloaded, ShuttingDown) as e:
            code = e.code
            return error_response(e.status, e.code, str(e) or _DEFAULT_MESSAGES.get(e.code, e.code))
        except Exception as e:
            code = "internal"
            logger.exception("translate failed")
            return error_response(500, "internal", f"{type(e).__name__}: {e}")
        finally:
            if code is not None:
                metrics.observe_error(code)
            metrics.observe_request("translate", time.perf_counter() - start, sentences)

    async def health(request: Request) -> Response:
        if getattr(backend, "ready", False):
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "loading"}, status_code=503)

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    return Starlette(routes=[
        Route("/v1/translate", translate, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ])


_DEFAULT_MESSAGES = {
    "queue_full": "the server's queue is full; retry later",
    "shutting_down": "the server is shutting down",
}
