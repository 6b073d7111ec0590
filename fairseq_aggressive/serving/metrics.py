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
# draft positions counted one by one; later positions are counted with the last
POSITIONS = 8


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
      drafted tokens at draft position 1..8 (8 counts every later one) and those accepted
    - ``fa_queue_length``: texts waiting for a worker
    - ``fa_workers``: decoding workers running
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
        self.queue_length = Gauge("fa_queue_length", "Texts waiting for a worker", registry=r)
        self.workers = Gauge("fa_workers", "Decoding workers running", registry=r)
        # every position shows from the start, at 0
        for p in range(1, POSITIONS + 1):
            self.position_drafted.labels(position=str(p))
            self.position_accepted.labels(position=str(p))

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

    def set_queue_length(self, n: int) -> None:
        self.queue_length.set(n)

    def set_workers(self, n: int) -> None:
        self.workers.set(n)

    def render(self) -> Tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
