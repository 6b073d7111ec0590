"""The server under a hostile client (tests/hostile.py) over real sockets, with
a fake backend: every bad, slow, oversized or vanishing request gets a JSON
4xx or a clean close (never a 5xx or a stall), a client that leaves has its
request cancelled, a request past --request-timeout gets 504, connections
beyond --max-connections get a JSON 503, and the server goes on serving."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import hostile  # noqa: E402
from fairseq_aggressive.serving.app import build_app  # noqa: E402
from fairseq_aggressive.serving.limits import Limits  # noqa: E402
from fairseq_aggressive.serving.metrics import ServiceMetrics  # noqa: E402
from fairseq_aggressive.serving.scheduler import Request  # noqa: E402
from fairseq_aggressive.serving.server import free_port, run_server  # noqa: E402

HEADER_TIMEOUT, BODY_TIMEOUT, REQUEST_TIMEOUT = 1.0, 1.0, 1.5
MAX_BODY, MAX_CONNECTIONS = 200_000, 12


class SlowBackend:
    """Upper-cases each text; a text "sleep N" takes N seconds, in steps that look
    at the request's cancellation as a worker's pass boundary does."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(8)
        self.cancelled, self.decoded = [], []

    def health(self):
        return {"status": "ok", "workers": 1, "workers_total": 1}

    def submit(self, texts, request_id=""):
        request = Request(list(texts), request_id)
        self.pool.submit(self._run, request)
        return request

    def _run(self, request):
        for i, t in enumerate(request.texts):
            if t.startswith("sleep "):
                end = time.monotonic() + float(t.split()[1])
                while time.monotonic() < end:
                    if request.gone:
                        self.cancelled.append((request.texts[0], request.cancelled))
                        return
                    time.sleep(0.01)
            self.decoded.append(t)
            request.done(i, t.upper())


@pytest.fixture(scope="module", params=["httptools", pytest.param("h11", marks=pytest.mark.slow)])
def server(request):
    if request.param == "httptools":
        pytest.importorskip("httptools")
    backend, metrics = SlowBackend(), ServiceMetrics()
    limits = Limits(max_body_bytes=MAX_BODY, body_timeout=BODY_TIMEOUT, request_timeout=REQUEST_TIMEOUT,
                    max_batch_texts=64, max_word_chars=100, max_input_chars=1000)
    app = build_app(backend, metrics, limits)
    port, stop = free_port(), threading.Event()
    t = threading.Thread(target=run_server, args=(app, "127.0.0.1", port, lambda left: None),
                         kwargs=dict(should_stop=stop.is_set, max_connections=MAX_CONNECTIONS,
                                     header_timeout=HEADER_TIMEOUT, http=request.param), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if hostile.exchange(port, hostile.request("GET", "/health", content_type=None), 5).status == 200:
                break
        except OSError:
            time.sleep(0.05)
    yield port, backend, metrics
    stop.set()
    t.join(10)


def _ok(port, text="hello"):
    o = hostile.exchange(port, hostile.request("POST", hostile.TRANSLATE, json.dumps({"text": text}).encode()))
    assert o.status == 200 and json.loads(o.raw) == {"text": text.upper()}, o
    return o


CASES = hostile.cases(HEADER_TIMEOUT, BODY_TIMEOUT, MAX_BODY)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_hostile_request_gets_a_json_4xx_or_a_clean_close(server, name):
    port, backend, metrics = server
    out = CASES[name](port)
    assert hostile.acceptable(out), (name, out)
    assert out.status != -1, f"{name}: the server stalled"
    _ok(port)  # and the server goes on serving
    assert metrics.registry.get_sample_value("fa_request_errors_total", {"code": "internal"}) in (None, 0.0)


def test_expected_codes(server):
    port = server[0]
    expect = {"slow_headers": (408, "header_timeout"), "slow_body": (408, "body_timeout"),
              "headers_then_nothing": (408, "body_timeout"), "continue_then_nothing": (408, "body_timeout"),
              "declared_huge_body": (413, "body_too_large"), "chunked_over_limit": (413, "body_too_large"),
              "garbage_request_line": (400, "bad_http"), "nested_json": (400, "bad_json"),
              "surrogate": (400, "bad_text"), "text_plain": (415, "unsupported_media_type"),
              "unknown_path": (404, "not_found"), "wrong_method": (405, "method_not_allowed"),
              "options": (405, "method_not_allowed"), "too_many_texts": (413, "too_many_texts"),
              "long_word": (413, "too_long")}
    for name, (status, code) in expect.items():
        out = CASES[name](port)
        assert (out.status, out.code) == (status, code), (name, out)


ODD = hostile.odd_cases()
BAD_HTTP, BAD_JSON, MEDIA = (400, "bad_http"), (400, "bad_json"), (415, "unsupported_media_type")
# what each bent request may get: (status, error code; None for a 200 or a HEAD's answer) pairs, and a
# 200's body. Two answers where HTTP lets the parser choose (httptools and h11 differ): both
# Content-Length and chunked (reject, or read the chunks), a folded header (reject, or unfold it: the
# media type then has the fold's word), a lowercase method (an unknown method), HTTP/2's preface.
ODD_EXPECT = {
    "pipelined": {(200, None)}, "expect_continue": {(200, "continued")}, "bad_chunk_size": {BAD_HTTP},
    "length_and_chunked": {BAD_HTTP, BAD_JSON}, "folded_header": {BAD_HTTP, MEDIA},
    "negative_length": {BAD_HTTP}, "plus_length": {BAD_HTTP},
    "lowercase_method": {BAD_HTTP, (405, "method_not_allowed")}, "http2_preface": {BAD_HTTP, (404, "not_found")},
    "long_url": {(431, "headers_too_large")}, "absolute_form": {(200, None)}, "get_with_body": {(200, None)},
    "head_health": {(200, None)}, "head_translate": {(405, None)}, "post_metrics": {(405, "method_not_allowed")},
    "percent_encoded_path": {(200, None)}, "query_string": {(200, None)}, "duplicate_keys": {(200, None)}, "byte_order_mark": {(200, None)},
    "huge_float": {(400, "not_a_string")}, "long_integer": {BAD_JSON}, "nul_in_text": {(400, "nul_byte")},
    "charset_latin1": {MEDIA}, "problem_json": {MEDIA}, "array_body": {(400, "missing_field")},
    "text_and_texts": {(400, "missing_field")}, "trailing_garbage": {BAD_JSON},
    "many_empty_texts": {(413, "too_many_texts")},
}
ODD_BODIES = {"expect_continue": b'{"text":"A"}', "percent_encoded_path": b'{"text":"A"}', "absolute_form": b'{"text":"A"}', "query_string": b'{"text":"A"}',
              "duplicate_keys": b'{"text":"B"}', "byte_order_mark": b'{"text":"A"}', "head_health": b"",
              "get_with_body": b'{"status":"ok","workers":1,"workers_total":1}'}


@pytest.mark.parametrize("name", sorted(ODD))
def test_bent_requests_get_what_http_and_json_allow(server, name):
    """Requests that bend HTTP/1.1 or JSON (pipelining, 100-continue, smuggling
    shapes, folded headers, absolute-form targets, HEAD, duplicate keys, a BOM,
    numbers past every limit): each gets a JSON answer the specifications allow
    (a 200 where they allow the request, the right body in it), in time, and
    the server goes on serving."""
    port, backend, metrics = server
    out = ODD[name](port)
    # (a HEAD's answer has no body, so no error code: its status and type are checked)
    assert (hostile.acceptable(out, allow_ok=True) or name.startswith("head_")) and out.status != -1, (name, out)
    assert (out.status, out.code) in ODD_EXPECT[name], (name, out)
    assert out.content_type.startswith("application/json") or name == "pipelined", (name, out)
    assert out.seconds < 5, (name, out)
    if name in ODD_BODIES:
        assert out.raw == ODD_BODIES[name], (name, out)
    if name == "pipelined":  # both answered, in order, each a 200 with its own text
        assert out.raw.count(b"HTTP/1.1 200 ") == 2, out
        assert 0 < out.raw.index(b'{"text":"ONE"}') < out.raw.index(b'{"text":"TWO"}'), out
    _ok(port)
    assert metrics.registry.get_sample_value("fa_request_errors_total", {"code": "internal"}) in (None, 0.0)


def test_slow_headers_are_cut_within_the_timeout(server):
    out = CASES["slow_headers"](server[0])
    assert out.status == 408 and HEADER_TIMEOUT * 0.9 <= out.seconds <= HEADER_TIMEOUT * 2 + 1, out
    idle = CASES["idle_connection"](server[0])  # nothing sent: closed without an answer nobody asked for
    assert idle.status is None and HEADER_TIMEOUT * 0.9 <= idle.seconds <= HEADER_TIMEOUT * 2 + 1, idle


def test_a_client_that_leaves_has_its_request_cancelled(server):
    port, backend, metrics = server
    before = metrics.registry.get_sample_value("fa_requests_cancelled_total", {"reason": "client_closed"}) or 0
    hostile.vanish_after_request(port, ["sleep 5", "after"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(t == "sleep 5" for t, _ in backend.cancelled):
        time.sleep(0.02)
    assert ("sleep 5", "client_closed") in backend.cancelled
    assert "after" not in backend.decoded
    assert metrics.registry.get_sample_value("fa_requests_cancelled_total", {"reason": "client_closed"}) == before + 1
    _ok(port)


def test_a_request_past_its_timeout_gets_504_and_is_cancelled(server):
    port, backend, metrics = server
    t0 = time.monotonic()
    o = hostile.exchange(port, hostile.request("POST", hostile.TRANSLATE, b'{"texts": ["sleep 10", "x"]}'))
    assert (o.status, o.code) == (504, "timeout") and o.seconds < REQUEST_TIMEOUT + 1.5, o
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and ("sleep 10", "timeout") not in backend.cancelled:
        time.sleep(0.02)
    assert ("sleep 10", "timeout") in backend.cancelled and time.monotonic() - t0 < 5
    assert metrics.registry.get_sample_value("fa_requests_cancelled_total", {"reason": "timeout"}) >= 1


def test_connections_beyond_the_limit_get_a_json_503(server):
    port = server[0]
    held = hostile.hold_connections(port, MAX_CONNECTIONS)
    try:
        time.sleep(0.1)
        out = hostile.exchange(port, hostile.request("GET", "/health", content_type=None), 5)
        assert (out.status, out.code) == (503, "too_many_connections"), out
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    _ok(port)


def test_health_answers_while_requests_are_slow(server):
    port = server[0]
    threads = [threading.Thread(target=hostile.exchange, args=(port, hostile.request(
        "POST", hostile.TRANSLATE, b'{"text": "sleep 1"}'))) for _ in range(6)]
    for t in threads:
        t.start()
    worst = 0.0
    for _ in range(20):
        o = hostile.exchange(port, hostile.request("GET", "/health", content_type=None), 5)
        assert o.status == 200
        worst = max(worst, o.seconds)
    for t in threads:
        t.join(10)
    assert worst < 0.05, worst
