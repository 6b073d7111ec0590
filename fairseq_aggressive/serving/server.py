"""Runs the app under uvicorn (:func:`run_server`) until SIGTERM or SIGINT,
then drains: the backend takes nothing new at once (503 ``shutting_down``),
uvicorn stops accepting connections and waits for the requests in flight to
be answered, and then ``on_shutdown(seconds_left)`` stops the backend within
what is left of the one drain budget."""
import signal
import socket
import threading
import time
from typing import Callable, List, Optional

import uvicorn

from .protocol import guarded_protocol

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Server(uvicorn.Server):
    """uvicorn's server that prints ``serving on http://HOST:PORT`` once it
    listens, calls ``on_signal()`` as soon as a stop signal comes, and stops
    by itself once ``should_stop()`` is true."""

    on_signal: Optional[Callable[[], None]] = None
    should_stop: Optional[Callable[[], bool]] = None
    signalled_at: Optional[float] = None

    async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            port = self.config.port
            if port == 0:  # the port the system picked
                port = self.servers[0].sockets[0].getsockname()[1]
            host = self.config.host
            if ":" in host:  # IPv6
                host = f"[{host}]"
            print(f"serving on http://{host}:{port}", flush=True)

    def handle_exit(self, sig, frame) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            if self.on_signal is not None:
                self.on_signal()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.should_stop is not None and self.should_stop():
            self.should_exit = True
        return await super().on_tick(counter)


def run_server(app, host: str, port: int, on_shutdown: Callable[[float], None],
               timeout_graceful_shutdown: float = 30.0, on_signal: Optional[Callable[[], None]] = None,
               should_stop: Optional[Callable[[], bool]] = None, max_connections: int = 0,
               header_timeout: float = 10.0, http: Optional[str] = None) -> int:
    """Serves ``app`` on ``host``:``port`` (0: a free port, printed) until SIGTERM
    or SIGINT (or ``should_stop()``); a second SIGINT stops without waiting.
    ``timeout_graceful_shutdown`` is the whole drain's budget: ``on_shutdown``
    gets the seconds left of it once uvicorn has stopped (it is called also
    when uvicorn fails to start).  Returns 0, or uvicorn's startup-failure code
    (not 0) where it did not start (the port is taken, ...).  ``http``: ``h11`` or
    ``httptools`` (default: httptools where installed)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False,
                            proxy_headers=False,
                            timeout_graceful_shutdown=timeout_graceful_shutdown,
                            http=guarded_protocol(max_connections, header_timeout, http))
    server = _Server(config)
    server.on_signal, server.should_stop = on_signal, should_stop
    # uvicorn handles the signals while it runs and raises them again once it has
    # stopped; these handlers take that second delivery, so that the process goes
    # on to drain the backend instead of dying of it
    # (signals reach the main thread only)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in STOP_SIGNALS}
    try:
        server.run()
        code = 0 if server.started else 1
    except SystemExit as e:  # uvicorn exits where it cannot listen
        code = e.code if isinstance(e.code, int) and e.code else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        since = server.signalled_at
        left = timeout_graceful_shutdown if since is None else timeout_graceful_shutdown - (time.monotonic() - since)
        on_shutdown(max(0.0, left))
    return code


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that no one listens on now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
