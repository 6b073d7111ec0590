"""The service's Prometheus metrics (:class:`ServiceMetrics`), kept in a
registry of their own so that several services (or tests) in one process do
not share counts.  The app records requests and errors; the backend pushes
what decoding did (passes, rows, tokens, acceptance by draft position) and its
queue length and worker count."""
from typing import Dict, List, Tuple

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# request latency from 0.5 ms to 10 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# rows (sentences) in one decoder pass
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# draft positions counted one by one, as the engine counts them (LOOP_POSITIONS); later positions are
# counted with the last
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
        self.batch_rows = Histogram("fa_batch_rows", "Rows (sentences) per decoder pass", buckets=ROW_BUCKETS,
                                    registry=r)
        self.passes = Counter("fa_passes", "Decoder passes", registry=r)
        self.pass_rows = Counter("fa_pass_rows", "Rows decoded, summed over decoder passes", registry=r)
        self.pass_tokens = Counter("fa_pass_tokens", "Tokens emitted, summed over decoder passes", registry=r)
        self.position_drafted = Counter(
            "fa_draft_position_drafted", f"Drafted tokens by draft position (position {POSITIONS} counts every "
            "later one)", ["position"], registry=r)
        self.position_accepted = Counter(
            "fa_draft_position_accepted", f"Accepted drafted tokens by draft position (position {POSITIONS} counts "
            "every later one)", ["position"], registry=r)
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
        # every position shows from the start, at 0
        for p in range(1, POSITIONS + 1):
            self.position_drafted.labels(position=str(p))
            self.position_accepted.labels(position=str(p))
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

    def observe_passes(self, passes: int, rows: int, tokens: int, row_histogram: Dict[int, int]) -> None:
        """``passes`` decoder passes that decoded ``rows`` rows in all and emitted
        ``tokens`` tokens; ``row_histogram`` maps a pass's row count to the number of
        passes with that many rows."""
        if passes:
            self.passes.inc(passes)
        if rows:
            self.pass_rows.inc(rows)
        if tokens:
            self.pass_tokens.inc(tokens)
        for k, count in row_histogram.items():
            for _ in range(int(count)):
                self.batch_rows.observe(k)

    def observe_positions(self, drafted: List[int], accepted: List[int]) -> None:
        """Drafted and accepted tokens by draft position: index i is position
        i + 1; positions from ``POSITIONS`` on are counted as ``POSITIONS``."""
        for counter, counts in ((self.position_drafted, drafted), (self.position_accepted, accepted)):
            for i, v in enumerate(counts):
                if v:
                    counter.labels(position=str(min(i + 1, POSITIONS))).inc(v)

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
