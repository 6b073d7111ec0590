"""The exceptions the backend raises and the app turns into HTTP errors: each
carries the HTTP status and the short code of the JSON error body
``{"error": {"code": ..., "message": ...}}``."""


class RequestError(ValueError):
    """The request's input is bad (an empty text, a text too long, ...): HTTP
    ``status`` (400 unless told) with ``code``, and the message saying which
    text and why."""

    def __init__(self, message: str, code: str = "bad_request", status: int = 400):
        super().__init__(message)
        self.code = code
        self.status = status

    @property
    def message(self) -> str:
        return str(self)


class Overloaded(RuntimeError):
    """The backend's queue is full: HTTP 503, code ``queue_full``; the client may retry later."""

    status = 503
    code = "queue_full"


class ShuttingDown(RuntimeError):
    """The server is draining and takes no new work: HTTP 503, code ``shutting_down``."""

    status = 503
    code = "shutting_down"
