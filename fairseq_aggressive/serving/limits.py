"""What a translate request may be (:class:`Limits`), how its body is read
(:func:`read_body`: refused by its declared length or while it streams in,
before it is all read) and parsed (:func:`parse_request`).  Every refusal is a
:class:`~fairseq_aggressive.serving.errors.RequestError` with its HTTP status
and code."""
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import ClientGone, RequestError


@dataclass
class Limits:
    """The server's bounds on one request (the ``--max-*`` and ``--*-timeout`` options)."""

    max_input_chars: int = 10000    # characters in one text
    max_body_bytes: int = 1 << 20   # bytes in one request body
    max_batch_texts: int = 64       # texts in one request
    max_word_chars: int = 200       # characters in one whitespace-separated word
    body_timeout: float = 30.0      # seconds to receive a body, from its headers
    request_timeout: float = 60.0   # seconds from the body to the answer (0: none)
    api_key: Optional[str] = None   # the bearer token every endpoint but /health asks for

    def check(self) -> None:
        for name in ("max_input_chars", "max_body_bytes", "max_batch_texts", "max_word_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.body_timeout <= 0 or self.request_timeout < 0:
            raise ValueError("--body-timeout must be > 0 and --request-timeout >= 0")


def check_content_type(value: Optional[str]) -> None:
    """JSON only: ``application/json``, with no charset or UTF-8 (415 otherwise).  A
    browser sends such a request across origins only after a CORS preflight, which
    this server never grants."""
    kind, _, params = (value or "").partition(";")
    charset = ""
    for p in params.split(";"):
        k, _, v = p.strip().partition("=")
        if k.lower() == "charset":
            charset = v.strip().strip('"').lower()
    if kind.strip().lower() != "application/json" or charset not in ("", "utf-8", "utf8"):
        raise RequestError(f"the body must be sent as Content-Type: application/json (UTF-8), not "
                           f"{value or 'none'!r}", code="unsupported_media_type", status=415)


async def read_body(receive, declared: Optional[str], limits: Limits) -> bytes:
    """The body from ASGI ``receive``, refused (413 ``body_too_large``) where its
    Content-Length (``declared``) or the bytes received pass ``max_body_bytes``,
    and (408 ``body_timeout``) where it has not all come within
    ``body_timeout`` seconds; :class:`ClientGone` where the client went away
    while sending it."""
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(f"Content-Length {declared!r} is not a number", code="bad_request", close=True)
        if int(declared) > limits.max_body_bytes:
            raise RequestError(f"the body has {declared} bytes; the limit is {limits.max_body_bytes}",
                               code="body_too_large", status=413, close=True)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise RequestError(f"the body has more than {limits.max_body_bytes} bytes, the limit",
                                       code="body_too_large", status=413, close=True)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestError(f"the body did not come within {limits.body_timeout:g} s", code="body_timeout",
                           status=408, close=True) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _max_digits() -> int:
    get = getattr(sys, "get_int_max_str_digits", None)
    return get() if get is not None else 4300


def parse_request(body: bytes, limits: Limits) -> Tuple[bool, List[str]]:
    """The texts of a translate request's body, and whether it sent one
    ``text`` (not a list); raises :class:`RequestError` naming what is wrong."""
    try:
        payload = json.loads(body)
    except RecursionError:
        raise RequestError("the body is not valid JSON: it is nested too deeply", code="bad_json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the body is not valid JSON: {e}", code="bad_json") from None
    except ValueError:  # an integer past Python's conversion limit (sys.get_int_max_str_digits)
        raise RequestError(f"the body holds an integer of more than {_max_digits()} digits", code="bad_json") from None
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
        if len(texts) > limits.max_batch_texts:
            raise RequestError(f'"texts" has {len(texts)} texts; the limit is {limits.max_batch_texts} a request',
                               code="too_many_texts", status=413)
        names = [f"texts[{i}]" for i in range(len(texts))]
    for name, text in zip(names, texts):
        _check_text(name, text, limits)
    return single, texts


def _check_text(name: str, text, limits: Limits) -> None:
    if not isinstance(text, str):
        raise RequestError(f"{name} must be a string, not a JSON {_json_type(text)}", code="not_a_string")
    if len(text) > limits.max_input_chars:
        raise RequestError(f"{name} has {len(text)} characters; the limit is {limits.max_input_chars}",
                           code="too_long", status=413)
    if not text.strip():
        raise RequestError(f"{name} is empty or whitespace only", code="empty_text")
    if "\x00" in text:
        raise RequestError(f"{name} contains a NUL byte (\\u0000)", code="nul_byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{name} is not valid Unicode: a lone surrogate at character {e.start}",
                           code="bad_text") from None
    longest = max(map(len, text.split()))
    if longest > limits.max_word_chars:
        raise RequestError(f"{name} has a word of {longest} characters; the limit is {limits.max_word_chars}",
                           code="word_too_long", status=413)


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
