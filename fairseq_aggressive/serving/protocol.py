"""uvicorn's HTTP/1.1 protocol (httptools' C parser where it is installed,
else h11) with the server's connection bounds (:func:`guarded_protocol`): at
most ``max_connections`` open connections (the next one is answered 503
``too_many_connections`` and closed), a request's headers within
``header_timeout`` seconds of the connection's start or of its previous
answer (else 408 ``header_timeout`` and a close; an idle keep-alive
connection just closes) and within ``MAX_HEAD_BYTES``
(else 431 ``headers_too_large``), and a malformed request answered with the
API's JSON error shape instead of uvicorn's plain text."""
import json
import logging

_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
# the most bytes of request line and headers one request may send
MAX_HEAD_BYTES = 64 * 1024


def base_protocol() -> type:
    """uvicorn's httptools protocol where httptools is installed (a C parser), else its h11 one."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        logging.getLogger("fairseq_aggressive.serving").warning(
            "httptools is not installed: HTTP is parsed by h11, in Python (pip install httptools)")
        return H11Protocol


def raw_error(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer that closes its connection, as bytes."""
    body = json.dumps({"error": {"code": code, "message": message, "request_id": ""}}).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedMixin:
    """The bounds, over either of uvicorn's HTTP/1.1 protocols."""

    max_connections = 0     # 0: no limit
    header_timeout = 10.0   # seconds

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer = None
        self._head_bytes, self._head_of, self._tail = 0, None, b""
        if self.max_connections and len(self.connections) > self.max_connections:
            transport.write(raw_error(503, "too_many_connections",
                                      f"the server holds {self.max_connections} connections (--max-connections); "
                                      "retry later"))
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._armed_on = self.cycle
        self._timer = self.loop.call_later(self.header_timeout, self._check_headers)

    def _check_headers(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy or self.cycle is not self._armed_on:  # a request came since: (its body and answer are the app's)
            self._arm()
            return
        if self._head_bytes and self._head_of is self.cycle:  # part of a request came: say why it ends
            self.transport.write(raw_error(408, "header_timeout",
                                           f"no request headers within {self.header_timeout:g} s"))
        self.transport.close()  # (an idle keep-alive connection just closes, as HTTP clients expect)

    def data_received(self, data: bytes) -> None:
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy:  # the bytes of a request whose headers have not all come (up to their end)
            if self._head_of is not self.cycle:
                self._head_bytes, self._head_of, self._tail = 0, self.cycle, b""
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end - len(self._tail))
            self._tail = seen[-3:]
            if self._head_bytes > MAX_HEAD_BYTES:
                self.transport.write(raw_error(431, "headers_too_large",
                                               f"the request line and headers pass {MAX_HEAD_BYTES} bytes"))
                self.transport.close()
                return
        super().data_received(data)

    def connection_lost(self, exc) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_error(400, "bad_http", f"not an HTTP/1.1 request this server reads: {msg}"))
        self.transport.close()


def guarded_protocol(max_connections: int, header_timeout: float, base=None) -> type:
    """uvicorn's protocol (``base``: ``"h11"``, ``"httptools"``, or None for
    :func:`base_protocol`) with these bounds, for ``uvicorn.Config(http=...)``."""
    if base == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    elif base == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    return type("GuardedProtocol", (GuardedMixin, base or base_protocol()),
                dict(max_connections=max(0, int(max_connections)), header_timeout=float(header_timeout)))
