"""uvicorn's HTTP/1.1 protocol (h11) with the server's connection bounds
(:func:`guarded_protocol`): at most ``max_connections`` open connections (the
next one is answered 503 ``too_many_connections`` and closed), a request's
headers within ``header_timeout`` seconds of the connection's start or of
its previous answer (else 408 ``header_timeout`` and a close), and a
malformed request answered with the API's JSON error shape instead of
uvicorn's plain text."""
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

_REASONS = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}


def raw_error(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer that closes its connection, as bytes."""
    body = json.dumps({"error": {"code": code, "message": message, "request_id": ""}}).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedProtocol(H11Protocol):
    max_connections = 0     # 0: no limit
    header_timeout = 10.0   # seconds

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer = None
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
        self.transport.write(raw_error(408, "header_timeout",
                                       f"no request headers within {self.header_timeout:g} s"))
        self.transport.close()

    def connection_lost(self, exc) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_error(400, "bad_http", f"not an HTTP/1.1 request this server reads: {msg}"))
        self.transport.close()


def guarded_protocol(max_connections: int, header_timeout: float) -> type:
    """:class:`GuardedProtocol` with these bounds, for ``uvicorn.Config(http=...)``."""
    return type("GuardedProtocol", (GuardedProtocol,), dict(max_connections=max(0, int(max_connections)),
                                                            header_timeout=float(header_timeout)))
