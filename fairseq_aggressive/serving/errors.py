"""The exceptions the backend raises and the app turns into HTTP errors: each
carries the HTTP status and the short code of the JSON error body
``{"error": {"code": ..., "message": ..., "request_id": ...}}``."""


class RequestError(ValueError):
    """The request is bad (an empty text, a text too long, ...): HTTP ``status``
    (400 unless told) with ``code``, and the message saying which text and
    why; ``close``: the connection closes after the answer (a body left unread)."""

    def __init__(self, message: str, code: str = "bad_request", status: int = 400, close: bool = False):
        super().__init__(message)
        self.code = code
        self.status = status
        self.close = close

    @property
    def message(self) -> str:
        return str(self)


class Overloaded(RuntimeError):
    """The backend's queue is full: HTTP 503, code ``queue_full``; the client may retry later."""

    status = 503
    code = "queue_full"
    close = False


class ShuttingDown(RuntimeError):
    """The server is draining and takes no new work: HTTP 503, code ``shutting_down``."""

    status = 503
    code = "shutting_down"
    close = False


class ClientGone(Exception):
    """The client went away before its answer (counted as ``client_closed``; nothing is sent)."""
