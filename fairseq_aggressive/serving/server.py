"""Runs the app under uvicorn (:func:`run_server`) until SIGTERM or SIGINT,
then drains: uvicorn stops accepting connections and waits (up to
``timeout_graceful_shutdown`` seconds) for the requests in flight to be
answered, and then ``on_shutdown`` stops the backend."""
import signal
import socket
import threading
from typing import Callable, List, Optional

import uvicorn

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Server(uvicorn.Server):
    """uvicorn's server that prints ``serving on http://HOST:PORT`` once it listens."""

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


def run_server(app, host: str, port: int, on_shutdown: Callable[[], None],
               timeout_graceful_shutdown: float = 30.0) -> int:
    """Serves ``app`` on ``host``:``port`` (0: a free port, printed) until SIGTERM
    or SIGINT; a second SIGINT stops without waiting.  Calls ``on_shutdown()``
    once uvicorn has stopped (also when it fails to start) and returns the exit
    code: 0, or uvicorn's startup-failure code (not 0) where it did not start
    (the port is taken, ...)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=timeout_graceful_shutdown)
    server = _Server(config)
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
        on_shutdown()
    return code


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that no one listens on now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
