"""The service's Prometheus metrics (:class:`ServiceMetrics`), kept in a
registry of their own so that several services (or tests) in one process do
not share counts.  The app records requests and errors; the backend pushes
what decoding did (passes, rows, tokens, acceptance by draft position) and its
queue length and worker count; the decoding counters (passes, rows, tokens,
acceptance by draft position) are the engine's own, read at each scrape
(:meth:`ServiceMetrics.set_decode_source`), so a worker spends nothing on
them between passes."""
from typing import Callable, List, Optional, Tuple

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

# request latency from 0.5 ms to 10 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# rows (sentences) in one decoder pass
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# draft positions counted one by one, as the engine counts them (native.c_api.LOOP_POSITIONS: this
# module imports nothing of the package, so that a server without it can load it); later positions
# are counted with the last
POSITIONS = 32
# request bodies from 64 bytes to 4 MiB
BODY_BUCKETS = tuple(64 * 4 ** k for k in range(9))


class ServiceMetrics:
    """The ``fa_*`` metrics of one service, in ``self.registry``.

    - ``fa_requests_total{endpoint}``: requests answered (errors included)
    - ``fa_request_errors_total{code}``: requests answered with an error, by its code
    - ``fa_request_latency_seconds``: time from receiving a request to its answer
    - ``fa_sentences_total``: sentences translated
    - ``fa_batch_rows``: rows per decoder pass
    - ``fa_passes_total``, ``fa_pass_rows_total``, ``fa_pass_tokens_total``: decoder
      passes, the rows they decoded (summed over passes) and the tokens they emitted;
      tokens / rows is the tokens a row emits per pass
    - ``fa_draft_position_drafted_total{position}``, ``fa_draft_position_accepted_total{position}``:
      drafted tokens at draft position 1..32 (32 counts every later one) and those accepted
    - ``fa_queue_length``: texts waiting for a worker
    - ``fa_workers``: decoding workers running
    - ``fa_requests_cancelled_total{reason}``: requests given up before their answer:
      ``client_closed`` (the client went away) or ``timeout`` (``--request-timeout``, answered 504)
    - ``fa_sentences_dropped_total{where}``: sentences of such requests that were not
      decoded (``queued``) or left the running batch unfinished (``decoding``)
    - ``fa_worker_restarts_total``: workers that died and were started again
    - ``fa_engine_faults_total``: sentences that failed in the engine when decoded alone
    - ``fa_request_body_bytes``: request bodies read, by size
    """

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("fa_requests", "Requests answered, errors included", ["endpoint"], registry=r)
        self.errors = Counter("fa_request_errors", "Requests answered with an error, by error code", ["code"],
                              registry=r)
        self.latency = Histogram("fa_request_latency_seconds", "Time from receiving a request to its answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.sentences = Counter("fa_sentences", "Sentences translated", registry=r)
        self._decode_source = None
        r.register(_DecodeCollector(self))
        self.cancelled = Counter("fa_requests_cancelled", "Requests given up before their answer, by reason",
                                 ["reason"], registry=r)
        self.dropped = Counter("fa_sentences_dropped", "Sentences of cancelled requests not decoded (queued) or "
                               "left unfinished (decoding)", ["where"], registry=r)
        self.restarts = Counter("fa_worker_restarts", "Workers that died and were started again", registry=r)
        self.faults = Counter("fa_engine_faults", "Sentences that failed in the engine when decoded alone",
                              registry=r)
        self.body_bytes = Histogram("fa_request_body_bytes", "Request bodies read, in bytes", buckets=BODY_BUCKETS,
                                    registry=r)
        self.queue_length = Gauge("fa_queue_length", "Texts waiting for a worker", registry=r)
        self.workers = Gauge("fa_workers", "Decoding workers running", registry=r)
        for reason in ("client_closed", "timeout"):
            self.cancelled.labels(reason=reason)
        for where in ("queued", "decoding"):
            self.dropped.labels(where=where)

    def observe_request(self, endpoint: str, seconds: float, sentences: int) -> None:
        """One request to ``endpoint`` answered after ``seconds`` with ``sentences`` translated (0 for an error)."""
        self.requests.labels(endpoint=endpoint).inc()
        self.latency.observe(seconds)
        if sentences:
            self.sentences.inc(sentences)

    def observe_error(self, code: str) -> None:
        """One request answered with the error ``code``."""
        self.errors.labels(code=code).inc()

    def set_decode_source(self, source: Optional[Callable[[], Optional[dict]]]) -> None:
        """Where the decoding counters come from at each scrape: ``source()`` returns
        the engine's counters since the start, summed over workers (a dict as
        :func:`decode_counters` makes), or None (no engine counters)."""
        self._decode_source = source

    def observe_cancel(self, reason: str) -> None:
        """A request given up (``client_closed``, ``timeout``)."""
        self.cancelled.labels(reason=reason).inc()

    def observe_dropped(self, n: int, where: str) -> None:
        self.dropped.labels(where=where).inc(n)

    def observe_restart(self) -> None:
        self.restarts.inc()

    def observe_fault(self) -> None:
        self.faults.inc()

    def observe_body(self, n: int) -> None:
        self.body_bytes.observe(n)

    def set_queue_length(self, n: int) -> None:
        self.queue_length.set(n)

    def set_workers(self, n: int) -> None:
        self.workers.set(n)

    def render(self) -> Tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


COUNTER_FIELDS = ("passes", "sentence_passes", "emitted")


def decode_counters(stats_list) -> dict:
    """The sum of running batches' counters (``RunStats``, or dicts as this
    returns) as a dict: passes, sentence_passes, emitted, and the lists
    pass_rows (passes by their rows), position_drafted and position_accepted."""
    out = {k: 0 for k in COUNTER_FIELDS}
    lists = {"pass_rows": [], "position_drafted": [], "position_accepted": []}
    for st in stats_list:
        get = st.get if isinstance(st, dict) else lambda k, st=st: getattr(st, k)
        for k in COUNTER_FIELDS:
            out[k] += int(get(k))
        for k, acc in lists.items():
            values = list(get(k))
            if len(acc) < len(values):
                acc.extend([0] * (len(values) - len(acc)))
            for i, v in enumerate(values):
                acc[i] += int(v)
    out.update(lists)
    return out


class _DecodeCollector:
    """The engine's counters as Prometheus metrics, read when scraped."""

    def __init__(self, metrics: ServiceMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        source = self.metrics._decode_source
        c = (source() if source is not None else None) or decode_counters([])
        yield _counter("fa_passes", "Decoder passes", c["passes"])
        yield _counter("fa_pass_rows", "Rows decoded, summed over decoder passes", c["sentence_passes"])
        yield _counter("fa_pass_tokens", "Tokens emitted, summed over decoder passes", c["emitted"])
        rows = c["pass_rows"]
        buckets, total, weighted = [], 0, 0
        for bound in ROW_BUCKETS:
            total = sum(rows[k] for k in range(min(bound + 1, len(rows))))
            buckets.append((str(float(bound)), total))
        count = sum(rows)
        weighted = sum(k * v for k, v in enumerate(rows))
        buckets.append(("+Inf", count))
        yield HistogramMetricFamily("fa_batch_rows", "Rows (sentences) per decoder pass", buckets=buckets,
                                    sum_value=weighted)
        for name, key, what in (("fa_draft_position_drafted", "position_drafted", "Drafted tokens"),
                                ("fa_draft_position_accepted", "position_accepted", "Accepted drafted tokens")):
            fam = CounterMetricFamily(name, f"{what} by draft position (position {POSITIONS} counts every later "
                                      "one)", labels=["position"])
            values = _folded(c[key], POSITIONS)
            for p, v in enumerate(values, start=1):
                fam.add_metric([str(p)], v)
            yield fam


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _folded(values: List[int], n: int) -> List[int]:
    """``values`` as ``n`` positions, every later one added to the last."""
    out = [0] * n
    for i, v in enumerate(values):
        out[min(i, n - 1)] += v
    return out
