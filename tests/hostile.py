"""A hostile HTTP client, written from the HTTP/1.1 and JSON specifications
rather than from the server's code: raw sockets, every request a server
meets from a buggy, slow, oversized or vanishing client.  Each case returns
what came back (:class:`Outcome`); :func:`acceptable` says whether a server
may answer so: a JSON 4xx (or a JSON 503 for too many connections) with the
error shape, or a clean close, never a 5xx, plain text or a stall."""
import json
import socket
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

TRANSLATE = "/v1/translate"


@dataclass
class Outcome:
    status: Optional[int]       # None: the connection closed with no answer
    code: Optional[str] = None  # the JSON error's code
    content_type: str = ""
    seconds: float = 0.0
    raw: bytes = b""


def _connect(port: int, timeout: float) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_answer(s: socket.socket, timeout: float, no_body: bool = False) -> Outcome:
    """One HTTP answer (or the close) read from ``s`` within ``timeout`` seconds
    (``no_body``: the answer to a HEAD request, which has none)."""
    start = time.monotonic()
    s.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return Outcome(None, seconds=time.monotonic() - start, raw=data)
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        n = 0 if no_body else int(headers.get("content-length", "0"))
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    except (ConnectionResetError, BrokenPipeError):
        return Outcome(None, seconds=time.monotonic() - start, raw=data)
    except socket.timeout:
        return Outcome(-1, seconds=time.monotonic() - start, raw=data)  # a stall
    out = Outcome(status, content_type=headers.get("content-type", ""), seconds=time.monotonic() - start,
                  raw=body[:n])
    try:
        payload = json.loads(out.raw)
        out.code = payload.get("error", {}).get("code") if isinstance(payload, dict) else None
    except ValueError:
        out.code = None
    return out


def exchange(port: int, data: bytes, timeout: float = 30.0, pause: float = 0.0, then: bytes = b"") -> Outcome:
    """Send ``data``, wait ``pause`` seconds, send ``then``; read the answer (with
    no body where ``data`` is a HEAD request)."""
    with _connect(port, timeout) as s:
        try:
            s.sendall(data)
            if pause:
                time.sleep(pause)
            if then:
                s.sendall(then)
        except (ConnectionResetError, BrokenPipeError):
            return Outcome(None)
        return read_answer(s, timeout, no_body=data.startswith(b"HEAD "))


def request(method: str, path: str, body: bytes = b"", content_type: Optional[str] = "application/json",
            extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    if method in ("POST", "PUT"):
        head += f"Content-Length: {len(body)}\r\n"
    return (head + extra + "\r\n").encode("latin-1") + body


def acceptable(o: Outcome, allow_ok: bool = False) -> bool:
    """A JSON 4xx with an error code, a JSON 503 (a bound on connections or the
    queue), a clean close, or (``allow_ok``) a 200."""
    if o.status is None:
        return True
    if o.status == 200:
        return allow_ok
    return (400 <= o.status < 500 or o.status == 503) and o.content_type.startswith("application/json") and bool(o.code)


def cases(header_timeout: float, body_timeout: float, max_body: int) -> Dict[str, Callable[[int], Outcome]]:
    """name -> case(port): each sends one kind of bad request."""
    j = "application/json"
    deep = b'{"texts": ' + b"[" * 200000 + b"]" * 200000 + b"}"
    return {
        "slow_headers": lambda p: exchange(p, b"POST /v1/translate HTTP/1.1\r\nHost: x\r\n",
                                           timeout=header_timeout * 3 + 5),
        "idle_connection": lambda p: exchange(p, b"", timeout=header_timeout * 3 + 5),
        "slow_body": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": "', j).replace(
            b"Content-Length: 10", b"Content-Length: 100"), timeout=body_timeout * 3 + 5),
        "continue_then_nothing": lambda p: _expect_continue(p, send_body=False, timeout=body_timeout * 3 + 5),
        "headers_then_nothing": lambda p: exchange(p, request("POST", TRANSLATE, b"", j).replace(
            b"Content-Length: 0", b"Content-Length: 100"), timeout=body_timeout * 3 + 5),
        "declared_huge_body": lambda p: exchange(p, request("POST", TRANSLATE, b"", j).replace(
            b"Content-Length: 0", b"Content-Length: 10000000000")),
        "chunked_over_limit": lambda p: _chunked(p, max_body * 2),
        "bad_content_length": lambda p: exchange(p, request("POST", TRANSLATE, b"{}", j).replace(
            b"Content-Length: 2", b"Content-Length: abc")),
        "two_content_lengths": lambda p: exchange(p, request("POST", TRANSLATE, b"{}", j, "Content-Length: 3\r\n")),
        "garbage_request_line": lambda p: exchange(p, b"GARBAGE\r\n\r\n"),
        "tls_hello": lambda p: exchange(p, bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64),
        "huge_headers": lambda p: exchange(p, request("GET", "/health", extra="X-A: " + "a" * 1000000 + "\r\n")),
        "nested_json": lambda p: exchange(p, request("POST", TRANSLATE, deep[:max_body], j)),
        "surrogate": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": "\\ud83d"}', j)),
        "invalid_utf8": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": "\xff\xfe"}', j)),
        "text_plain": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": "a"}', "text/plain")),
        "no_content_type": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": "a"}', None)),
        "form": lambda p: exchange(p, request("POST", TRANSLATE, b"text=a", "application/x-www-form-urlencoded")),
        "unknown_path": lambda p: exchange(p, request("GET", "/admin", content_type=None)),
        "wrong_method": lambda p: exchange(p, request("DELETE", TRANSLATE, content_type=None)),
        "options": lambda p: exchange(p, request("OPTIONS", TRANSLATE, content_type=None,
                                                 extra="Origin: http://evil.example\r\n")),
        "too_many_texts": lambda p: exchange(p, request("POST", TRANSLATE, json.dumps(
            {"texts": ["a"] * min(100000, max_body // 6)}).encode(), j)),
        "long_word": lambda p: exchange(p, request("POST", TRANSLATE, json.dumps({"text": "a" * 5000}).encode(), j)),
        "disconnect_mid_body": lambda p: _vanish(p, request("POST", TRANSLATE, b'{"te', j).replace(
            b"Content-Length: 4", b"Content-Length: 40")),
        "null_text": lambda p: exchange(p, request("POST", TRANSLATE, b'{"text": null}', j)),
        "number_body": lambda p: exchange(p, request("POST", TRANSLATE, b"12", j)),
        "http10_no_host": lambda p: exchange(p, b"POST /v1/translate HTTP/1.0\r\nContent-Type: application/json\r\n"
                                                b"Content-Length: 2\r\n\r\n{}"),
    }


def odd_cases() -> Dict[str, Callable[[int], Outcome]]:
    """name -> case(port): requests that bend HTTP or JSON without being
    oversized or slow; each may get a JSON 4xx, a clean close, or (where
    HTTP or JSON allows the request) a 200 (tests/test_serving_hostile.py
    says which)."""
    j = "application/json"
    head = "POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

    def raw(text: str) -> Callable[[int], Outcome]:
        return lambda p: exchange(p, text.encode("latin-1"), timeout=10)

    def post(body: bytes, ct: Optional[str] = j, path: str = TRANSLATE) -> Callable[[int], Outcome]:
        return lambda p: exchange(p, request("POST", path, body, ct), timeout=10)

    return {
        "pipelined": _pipelined,
        "expect_continue": _expect_continue,
        "bad_chunk_size": raw(head + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"),
        "length_and_chunked": raw(head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        "folded_header": raw(head + "  folded\r\nContent-Length: 2\r\n\r\n{}"),
        "negative_length": raw(head + "Content-Length: -1\r\n\r\n"),
        "plus_length": raw(head + 'Content-Length: +12\r\n\r\n{"text": "a"}'),
        "lowercase_method": raw('post /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                                'Content-Length: 13\r\n\r\n{"text": "a"}'),
        "http2_preface": raw("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        "long_url": raw("GET /" + "a" * 100000 + " HTTP/1.1\r\nHost: x\r\n\r\n"),
        "absolute_form": raw('POST http://x/v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                             'Content-Length: 13\r\n\r\n{"text": "a"}'),
        "get_with_body": raw("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"),
        "head_health": raw("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"),
        "head_translate": raw("HEAD /v1/translate HTTP/1.1\r\nHost: x\r\n\r\n"),
        "post_metrics": post(b"{}", path="/metrics"),
        "percent_encoded_path": post(b'{"text": "a"}', path="/v1/%74ranslate"),
        "query_string": post(b'{"text": "a"}', path=TRANSLATE + "?x=%ZZ&&=="),
        "duplicate_keys": post(b'{"text": "a", "text": "b"}'),
        "byte_order_mark": post(b'\xef\xbb\xbf{"text": "a"}'),
        "huge_float": post(b'{"text": 1e999999}'),
        "long_integer": post(b'{"text": "a", "x": ' + b"9" * 5000 + b"}"),
        "nul_in_text": post(b'{"text": "a\\u0000b"}'),
        "charset_latin1": post(b'{"text": "a"}', "application/json; charset=latin-1"),
        "problem_json": post(b'{"text": "a"}', "application/problem+json"),
        "array_body": post(b'["a"]'),
        "text_and_texts": post(b'{"text": "a", "texts": ["b"]}'),
        "trailing_garbage": post(b'{"text": "a"} xyz'),
        "many_empty_texts": post(json.dumps({"texts": [""] * 5000}).encode()),
    }


def _pipelined(port: int) -> Outcome:
    """Two requests in one write: both answered, in order (``raw``: everything
    read until the server closes after the second, which asks it to)."""
    first = request("POST", TRANSLATE, b'{"text": "one"}')
    second = request("POST", TRANSLATE, b'{"text": "two"}', extra="Connection: close\r\n")
    with _connect(port, 10) as s:
        s.sendall(first + second)
        data, start = b"", time.monotonic()
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            return Outcome(-1, seconds=time.monotonic() - start, raw=data)
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None
    return Outcome(status, seconds=time.monotonic() - start, raw=data)


def _expect_continue(port: int, send_body: bool = True, timeout: float = 10) -> Outcome:
    """Headers with ``Expect: 100-continue``, the body only after the server's
    100 (``send_body`` False: never); the answer that follows (``code`` of a
    200: "continued" when the 100 came)."""
    body = b'{"text": "a"}'
    with _connect(port, timeout) as s:
        s.sendall(request("POST", TRANSLATE, body, extra="Expect: 100-continue\r\n")[: -len(body)])
        interim = read_answer(s, timeout)
        if interim.status != 100:
            return interim
        if send_body:
            s.sendall(body)
        out = read_answer(s, timeout)
        out.code = out.code or "continued"
        return out


def _chunked(port: int, total: int) -> Outcome:
    """A chunked body that goes on past the limit: answered (413) before it is all sent."""
    head = (b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b" " * 16384
    with _connect(port, 30) as s:
        s.sendall(head)
        sent = 0
        try:
            while sent < total:
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
            s.sendall(b"0\r\n\r\n")
        except (ConnectionResetError, BrokenPipeError):
            pass
        return read_answer(s, 30)


def _vanish(port: int, data: bytes) -> Outcome:
    """Send part of a request and go away: there is nobody to answer."""
    with _connect(port, 10) as s:
        s.sendall(data)
    return Outcome(None)


def vanish_after_request(port: int, texts, wait: float = 0.05) -> None:
    """Send a whole translate request and go away before its answer."""
    body = json.dumps({"texts": list(texts)}).encode()
    with _connect(port, 10) as s:
        s.sendall(request("POST", TRANSLATE, body))
        time.sleep(wait)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # a reset


def hold_connections(port: int, n: int):
    """``n`` open connections that send nothing (close them yourself)."""
    return [_connect(port, 10) for _ in range(n)]
