"""The load generator's pieces: a minimal asyncio HTTP/1.1 keep-alive client,
percentiles and Poisson arrival schedules."""
import asyncio
import json
import math
import random
import time
from typing import List, Optional, Sequence


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0..100) of ``xs`` by linear interpolation between
    the closest ranks (numpy's default); None for no values."""
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def poisson_schedule(rate: float, duration: float, cap: int, seed: int = 0) -> List[float]:
    """Arrival times (s from the start, increasing) of a Poisson process of
    ``rate`` arrivals per second: exponential gaps, every arrival before
    ``duration``, at most ``cap`` of them; the same ``seed``, the same schedule."""
    if rate <= 0:
        raise ValueError(f"the arrival rate must be > 0, got {rate}")
    rng = random.Random(seed)
    out: List[float] = []
    t = 0.0
    while len(out) < cap:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append(t)
    return out


class _Unanswered(ConnectionError):
    """The connection closed before any byte of an answer."""


class HttpClient:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams (one connection
    per request in flight, reused), cheap enough beside the servers it loads.

    uvicorn closes a connection idle for 5 s (its ``timeout_keep_alive``): a
    connection idle for more than :attr:`MAX_IDLE` s is not reused, and a
    request on a reused connection that the server closed before answering
    anything is sent again once on a new connection (as HTTP clients do)."""

    MAX_IDLE = 2.0

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.idle: List = []  # (reader, writer, idle since)
        self.reconnects = 0  # requests sent again after a reused connection was closed

    async def request(self, method: str, path: str, payload=None, timeout: float = 60.0):
        """(status, body bytes)."""
        return await asyncio.wait_for(self._request(method, path, payload), timeout)

    def _reusable(self):
        now = time.perf_counter()
        while self.idle:
            reader, writer, since = self.idle.pop()
            if now - since <= self.MAX_IDLE and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _request(self, method, path, payload):
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        conn = self._reusable()
        if conn is not None:
            try:
                return await self._exchange(conn, head + body)
            except _Unanswered:
                self.reconnects += 1
        return await self._exchange(await asyncio.open_connection(self.host, self.port), head + body)

    async def _exchange(self, conn, data: bytes):
        reader, writer = conn
        try:
            writer.write(data)
            try:
                status_line = await reader.readline()
            except ConnectionError as e:
                raise _Unanswered(str(e)) from None
            if not status_line:
                raise _Unanswered("the server closed the connection")
            status = int(status_line.split()[1])
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if "content-length" not in headers:
                raise ConnectionError(f"no Content-Length in the answer ({headers})")
            data = await reader.readexactly(int(headers["content-length"]))
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer, time.perf_counter()))
        return status, data

    async def translate(self, text: str, timeout: float):
        """(status, output text or the error body)."""
        status, data = await self.request("POST", "/v1/translate", {"text": text}, timeout)
        obj = json.loads(data)
        return status, (obj["text"] if status == 200 else obj)

    async def close(self):
        for _, writer, _ in self.idle:
            writer.close()
        self.idle = []
