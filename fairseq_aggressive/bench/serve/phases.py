"""The phases of one system's run over HTTP (latency, capacity, open loop),
every answer checked against the reference, and the decoder counters of the
server's ``/metrics`` between them."""
import asyncio
import itertools
import time
from typing import Dict, List, Optional

from .client import HttpClient, percentile, poisson_schedule
from .servers import HOST

WARMUP = 3  # requests before the latency phase (checked, not timed)
QUEUE_FULL = "queue_full"  # the error code of a 503 for a full queue (load shed, not a failure)


class Checker:
    """Every answer against the reference: per sentence, whether all its answers
    equal it; answers refused for a full queue, and failed requests, counted apart."""

    def __init__(self, sentences: List[str], reference: List[str]):
        self.sentences, self.reference = sentences, reference
        self.seen: Dict[int, bool] = {}
        self.responses = self.equal = self.errors = self.refused = 0
        self.examples: List[Dict] = []

    def check(self, i: int, status: Optional[int], out) -> str:
        """``ok``, ``refused`` (503 queue_full) or ``failed``."""
        if status != 200:
            refused = status == 503 and isinstance(out, dict) and out.get("error", {}).get("code") == QUEUE_FULL
            if refused:
                self.refused += 1
            else:
                self.errors += 1
            if len(self.examples) < 5 and (not refused or self.refused == 1):
                self.examples.append({"sentence": i, "status": status, "error": out})
            return "refused" if refused else "failed"
        self.responses += 1
        same = out == self.reference[i]
        self.equal += same
        first_difference = not same and self.seen.get(i, True)
        self.seen[i] = self.seen.get(i, True) and same
        if first_difference and len(self.examples) < 5:
            self.examples.append({"sentence": i, "source": self.sentences[i], "got": out,
                                  "greedy": self.reference[i]})
        return "ok"

    def summary(self) -> Dict:
        return {"sentences_equal": sum(self.seen.values()), "sentences": len(self.seen),
                "responses_equal": self.equal, "responses": self.responses, "errors": self.errors,
                "refused": self.refused, "examples": self.examples}


class Tally:
    """One phase's outcomes: latencies of the answered requests (with their
    sentence), refused and failed counts, the time of the last answer."""

    def __init__(self, start: float):
        self.start = self.last = start
        self.lat: List[float] = []
        self.which: List[int] = []
        self.counts = {"ok": 0, "refused": 0, "failed": 0}

    def add(self, outcome: str, i: int, seconds: float) -> None:
        self.counts[outcome] += 1
        if outcome == "ok":
            self.lat.append(seconds)
            self.which.append(i)
        self.last = max(self.last, time.perf_counter())

    def stats(self, end: Optional[float] = None) -> Dict:
        seconds = (self.last if end is None else end) - self.start
        ms = [1000 * x for x in self.lat]
        r = lambda x: None if x is None else round(x, 3)  # noqa: E731
        c = self.counts
        slowest = sorted(zip(ms, self.which), reverse=True)[:5]
        return {"requests": sum(c.values()), "ok": c["ok"], "refused": c["refused"], "errors": c["failed"],
                "seconds": round(seconds, 3),
                "sentences_per_s": round(c["ok"] / seconds, 2) if seconds > 0 else None,
                "p50_ms": r(percentile(ms, 50)), "p90_ms": r(percentile(ms, 90)), "p99_ms": r(percentile(ms, 99)),
                "mean_ms": r(sum(ms) / len(ms)) if ms else None,
                "slowest": [{"sentence": i, "ms": round(x, 2)} for x, i in slowest]}


async def _one(client, checker, i, text, timeout) -> str:
    """One request, its answer checked: ``ok``, ``refused`` or ``failed``."""
    try:
        status, out = await client.translate(text, timeout)
    except Exception as e:  # noqa: BLE001  (a timeout, a broken connection: a failed request)
        return checker.check(i, None, f"{type(e).__name__}: {e}")
    return checker.check(i, status, out)


async def latency_phase(client, checker, sentences, duration, cap, timeout) -> Dict:
    """One request at a time over the sentences."""
    tally = Tally(time.perf_counter())
    for i, s in enumerate(sentences):
        if i >= cap or time.perf_counter() - tally.start >= duration:
            break
        t0 = time.perf_counter()
        outcome = await _one(client, checker, i, s, timeout)
        tally.add(outcome, i, time.perf_counter() - t0)
    return tally.stats(time.perf_counter())


async def capacity_phase(client, checker, sentences, clients, duration, cap, timeout) -> Dict:
    """``clients`` closed-loop clients, each sending the next sentence once its last is answered."""
    counter = itertools.count()
    tally = Tally(time.perf_counter())
    stop_at = tally.start + duration

    async def loop():
        while True:
            k = next(counter)
            if k >= cap or time.perf_counter() >= stop_at:
                return
            i = k % len(sentences)
            t0 = time.perf_counter()
            outcome = await _one(client, checker, i, sentences[i], timeout)
            tally.add(outcome, i, time.perf_counter() - t0)

    await asyncio.gather(*[loop() for _ in range(clients)])
    res = tally.stats()
    res["clients"] = clients
    return res


async def open_loop_phase(client, checker, sentences, rate, duration, cap, timeout, seed) -> Dict:
    """Poisson arrivals at ``rate`` per second; each request's latency runs from
    its scheduled arrival (a client that falls behind is counted against the server)."""
    schedule = poisson_schedule(rate, duration, cap, seed)
    tally = Tally(time.perf_counter() + 0.005)
    behind = []

    async def arrival(k, at):
        i = k % len(sentences)
        behind.append(time.perf_counter() - at)
        outcome = await _one(client, checker, i, sentences[i], timeout)
        tally.add(outcome, i, time.perf_counter() - at)

    tasks = []
    for k, offset in enumerate(schedule):
        at = tally.start + offset
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(arrival(k, at)))
    if tasks:
        await asyncio.wait(tasks)  # each request has its own timeout
    res = tally.stats()
    res.update(offered_per_s=round(rate, 2), arrivals=len(schedule),
               client_lag_p99_ms=round(1000 * percentile(behind, 99), 3) if behind else None)
    return res


def _counters(text: str) -> Dict[str, float]:
    """The decoder counters of a ``/metrics`` answer (the continuous-batching
    servers fill them; the others have requests and sentences only)."""
    vals: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            vals[name] = vals.get(name, 0.0) + float(value)
        except ValueError:
            pass
    out = {k: vals.get(f"fa_{k}_total", 0.0) for k in ("passes", "pass_rows", "pass_tokens", "sentences")}
    out["request_errors"] = sum(v for k, v in vals.items() if k.startswith("fa_request_errors_total"))
    out["passes_up_to_8_rows"] = vals.get('fa_batch_rows_bucket{le="8.0"}', 0.0)
    return out


def _decoder(before: Optional[Dict], after: Optional[Dict]) -> Optional[Dict]:
    """What the decoder did between two :func:`_counters`: passes, rows per pass,
    tokens a row emits per pass (1 without drafts), passes of more than 8 rows."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in after}
    out = {"passes": int(d["passes"]), "sentences": int(d["sentences"]), "request_errors": int(d["request_errors"])}
    if d["passes"]:
        out["rows_per_pass"] = round(d["pass_rows"] / d["passes"], 2)
        out["passes_over_8_rows"] = round(1 - d["passes_up_to_8_rows"] / d["passes"], 3)
    if d["pass_rows"]:
        out["tokens_per_row_pass"] = round(d["pass_tokens"] / d["pass_rows"], 3)
    return out


async def _snapshot(client) -> Optional[Dict]:
    try:
        status, data = await client.request("GET", "/metrics", timeout=10)
    except Exception:  # noqa: BLE001  (the metrics are extra: a phase does not fail for them)
        return None
    return _counters(data.decode()) if status == 200 else None


async def run_phases(port: int, sentences, reference, args, checker) -> Dict:
    client = HttpClient(HOST, port)
    timeout = max(60.0, 3 * args.duration)
    try:
        for i in range(min(WARMUP, len(sentences))):
            await _one(client, checker, i, sentences[i], timeout)
        first = snap = await _snapshot(client)

        async def phase(run):
            nonlocal snap
            res = await run
            now = await _snapshot(client)
            res["decoder"] = _decoder(snap, now)
            snap = now
            return res

        res = {"latency": await phase(latency_phase(client, checker, sentences, args.duration, args.requests_cap,
                                                    timeout))}
        cap = await phase(capacity_phase(client, checker, sentences, args.clients, args.duration,
                                         args.requests_cap, timeout))
        res["capacity"] = cap
        res["open_loop"] = []
        for k, f in enumerate(args.rates):
            if not cap["sentences_per_s"]:
                break
            point = await phase(open_loop_phase(client, checker, sentences, f * cap["sentences_per_s"],
                                                args.duration, args.requests_cap, timeout, seed=1000 + k))
            res["open_loop"].append(dict(fraction=f, **point))
        res["server_metrics"] = _decoder(first, snap)
        res["client_reconnects"] = client.reconnects
        return res
    finally:
        await client.close()
