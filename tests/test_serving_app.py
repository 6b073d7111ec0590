"""The HTTP layer of the service (fairseq_aggressive/serving), with a fake
backend that upper-cases its texts: the translate endpoint's answers and
errors, /health, /metrics, and the server's drain on SIGTERM."""
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")
import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fairseq_aggressive.serving.app import build_app  # noqa: E402
from fairseq_aggressive.serving.errors import Overloaded, RequestError, ShuttingDown  # noqa: E402
from fairseq_aggressive.serving.metrics import ServiceMetrics  # noqa: E402
from fairseq_aggressive.serving.server import free_port, run_server  # noqa: E402

MAX_CHARS = 20
MAX_TEXTS = 5
MAX_WORD = 12
MAX_BODY = 300000


class FakeBackend:
    """Upper-cases each text. ``raise_on_submit`` is raised by submit;
    ``future_error`` is set on the Future it returns; ``outputs`` replaces the answer."""

    def __init__(self, ready=True):
        self.ready = ready
        self.submitted = []
        self.raise_on_submit = None
        self.future_error = None
        self.outputs = None

    def submit(self, texts, request_id=""):
        if self.raise_on_submit is not None:
            raise self.raise_on_submit
        self.submitted.append(list(texts))
        future = Future()
        if self.future_error is not None:
            future.set_exception(self.future_error)
        else:
            future.set_result(self.outputs if self.outputs is not None else [t.upper() for t in texts])
        return future


@pytest.fixture
def backend():
    return FakeBackend()


@pytest.fixture
def metrics():
    return ServiceMetrics()


@pytest.fixture
def client(backend, metrics):
    with TestClient(build_app(backend, metrics, max_input_chars=MAX_CHARS, max_batch_texts=MAX_TEXTS,
                              max_word_chars=MAX_WORD, max_body_bytes=MAX_BODY)) as c:
        yield c


def sample(metrics_text, name, **labels):
    """The value of sample ``name`` with ``labels`` in Prometheus text, or None."""
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def assert_error(response, status, code, *in_message):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    for part in in_message:
        assert part in body["error"]["message"], body


def test_translate_one_text(client, backend):
    r = client.post("/v1/translate", json={"text": "hello world"})
    assert r.status_code == 200
    assert r.json() == {"text": "HELLO WORLD"}
    assert backend.submitted == [["hello world"]]


def test_translate_texts_in_order(client, backend):
    texts = ["one", "привіт світ", "three"]
    r = client.post("/v1/translate", json={"texts": texts})
    assert r.status_code == 200
    assert r.json() == {"texts": ["ONE", "ПРИВІТ СВІТ", "THREE"]}
    assert backend.submitted == [texts]


def test_text_of_exactly_the_limit_is_taken(client):
    text = ("x" * (MAX_CHARS // 2 - 1) + " ") * 2  # (words within MAX_WORD)
    assert len(text) == MAX_CHARS
    r = client.post("/v1/translate", json={"text": text})
    assert r.status_code == 200 and r.json() == {"text": text.upper()}


BAD_REQUESTS = [
    (b'{"text": "a"', 400, "bad_json", ["not valid JSON"]),
    (b"\xff\xfe\x00garbage", 400, "bad_json", ["not valid JSON"]),
    (b"", 400, "bad_json", ["not valid JSON"]),
    (b'["a", "b"]', 400, "missing_field", ["JSON object", "array"]),
    (b"{}", 400, "missing_field", ['"text"', '"texts"', "neither"]),
    (b'{"txt": "a"}', 400, "missing_field", ["neither"]),
    (b'{"text": "a", "texts": ["b"]}', 400, "missing_field", ["both"]),
    (b'{"text": 5}', 400, "not_a_string", ['"text" must be a string', "number"]),
    (b'{"text": ["a"]}', 400, "not_a_string", ['"text" must be a string', "array"]),
    (b'{"texts": "abc"}', 400, "not_a_string", ['"texts" must be a list of strings', "string"]),
    (b'{"texts": ["a", null]}', 400, "not_a_string", ["texts[1]", "null"]),
    (b'{"text": ""}', 400, "empty_text", ["text is empty"]),
    (b'{"text": "  \\n\\t "}', 400, "empty_text", ["text is empty or whitespace only"]),
    (b'{"texts": ["a", "b", " "]}', 400, "empty_text", ["texts[2]"]),
    (b'{"texts": []}', 400, "empty_text", ['"texts" is empty']),
    (b'{"text": "a\\u0000b"}', 400, "nul_byte", ["text contains a NUL byte"]),
    (b'{"texts": ["a", "b\\u0000"]}', 400, "nul_byte", ["texts[1] contains a NUL byte"]),
    (json.dumps({"text": "x" * (MAX_CHARS + 1)}).encode(), 413, "too_long",
     [f"text has {MAX_CHARS + 1} characters", f"the limit is {MAX_CHARS}"]),
    (json.dumps({"texts": ["ok", "y" * 100]}).encode(), 413, "too_long",
     ["texts[1] has 100 characters", f"the limit is {MAX_CHARS}"]),
    (b"[" * 100000 + b"]" * 100000, 400, "bad_json", ["nested too deeply"]),
    (b'{"texts": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "bad_json", ["nested too deeply"]),
    (b'{"texts": [[["a"]]]}', 400, "not_a_string", ["texts[0]", "array"]),
    (b'{"text": "a\ud800b"}', 400, "bad_text", ["lone surrogate at character 1"]),
    (b'{"texts": ["ok", "\udfff"]}', 400, "bad_text", ["texts[1]", "lone surrogate"]),
    (b'{"text": "\xc3\x28"}', 400, "bad_json", ["not valid JSON"]),
    (b'{"text": "a", "n": ' + b"9" * 5000 + b"}", 400, "bad_json", ["an integer of more than"]),
    ('{"text": "ok"}'.encode("utf-16"), 200, None, []),
    (json.dumps({"texts": ["a"] * (MAX_TEXTS + 1)}).encode(), 413, "too_many_texts", [f"limit is {MAX_TEXTS}"]),
    (json.dumps({"text": "a " + "w" * (MAX_WORD + 1)}).encode(), 413, "word_too_long",
     [f"a word of {MAX_WORD + 1} characters"]),
]


@pytest.mark.parametrize("body,status,code,in_message", BAD_REQUESTS, ids=[
    "truncated_json", "not_utf8", "no_body", "array_body", "empty_object", "other_field", "both_fields",
    "text_number", "text_list", "texts_string", "texts_null_item", "empty", "whitespace", "texts_whitespace_item",
    "texts_empty_list", "nul", "texts_nul_item", "too_long", "texts_too_long_item", "nested", "nested_in_texts",
    "nested_item", "surrogate", "texts_surrogate", "invalid_utf8", "long_integer", "utf16", "too_many_texts",
    "word_too_long"])
def test_bad_request_is_answered_with_its_error(client, backend, body, status, code, in_message):
    r = client.post("/v1/translate", content=body, headers={"Content-Type": "application/json"})
    if status == 200:  # JSON may come in UTF-16 or UTF-32 (RFC 8259 readers may take them)
        assert r.json() == {"text": "OK"}
        return
    assert_error(r, status, code, *in_message)
    assert backend.submitted == []  # never reached the backend
    # and the server goes on serving
    assert client.post("/v1/translate", json={"text": "next"}).json() == {"text": "NEXT"}


@pytest.mark.parametrize("where", ["submit", "future"])
@pytest.mark.parametrize("error,status,code,in_message", [
    (RequestError("texts[1] has 300 tokens after BPE; the limit is 256", code="too_long", status=413),
     413, "too_long", ["texts[1] has 300 tokens", "the limit is 256"]),
    (RequestError("text is not valid", code="bad_text"), 400, "bad_text", ["text is not valid"]),
    (Overloaded("the queue is full (64 texts waiting)"), 503, "queue_full", ["64 texts waiting"]),
    (Overloaded(), 503, "queue_full", ["queue is full"]),
    (ShuttingDown(), 503, "shutting_down", ["shutting down"]),
    (RuntimeError("the worker died"), 500, "internal", ["internal error"]),
    (KeyError("missing"), 500, "internal", ["internal error"]),
], ids=["too_long", "other_request_error", "overloaded", "overloaded_no_message", "shutting_down", "runtime_error",
        "key_error"])
def test_backend_error_is_answered_and_server_stays_up(client, backend, metrics, where, error, status, code,
                                                       in_message, caplog):
    if where == "submit":
        backend.raise_on_submit = error
    else:
        backend.future_error = error
    r = client.post("/v1/translate", json={"texts": ["a", "b"]})
    assert_error(r, status, code, *in_message)
    rid = r.json()["error"]["request_id"]
    assert rid and r.headers["X-Request-ID"] == rid
    if code == "queue_full":
        assert r.headers["Retry-After"] == "1"
    else:
        assert "Retry-After" not in r.headers
    if status == 500:  # the body names nothing of the server; the log line with its id says what failed
        assert r.json()["error"]["message"] == "internal error"
        assert any(rid in rec.getMessage() and str(error.args[0]) in rec.getMessage() for rec in caplog.records)
    assert metrics.registry.get_sample_value("fa_request_errors_total", {"code": code}) == 1
    backend.raise_on_submit = backend.future_error = None
    r = client.post("/v1/translate", json={"text": "after"})
    assert r.status_code == 200 and r.json() == {"text": "AFTER"}


def test_backend_answering_the_wrong_number_of_outputs_is_an_internal_error(client, backend):
    backend.outputs = ["ONLY ONE"]
    assert_error(client.post("/v1/translate", json={"texts": ["a", "b"]}), 500, "internal", "internal error")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/json; charset=latin-1",
                                          "application/jsonx"])
def test_a_body_not_sent_as_json_is_refused(client, backend, content_type):
    # a web page can make a browser POST text/plain (or a form) to 127.0.0.1 without a CORS preflight
    headers = {"Content-Type": content_type} if content_type else {}
    r = client.post("/v1/translate", content=b'{"text": "a"}', headers=headers)
    assert_error(r, 415, "unsupported_media_type", "application/json")
    assert backend.submitted == []
    ok = client.post("/v1/translate", content=b'{"text": "a"}',
                     headers={"Content-Type": "Application/JSON; Charset=UTF-8"})
    assert ok.status_code == 200 and ok.json() == {"text": "A"}


@pytest.mark.parametrize("method,path,status,code", [
    ("GET", "/v1/translate", 405, "method_not_allowed"), ("PUT", "/v1/translate", 405, "method_not_allowed"),
    ("DELETE", "/health", 405, "method_not_allowed"), ("POST", "/metrics", 405, "method_not_allowed"),
    ("GET", "/", 404, "not_found"), ("POST", "/v1/translat", 404, "not_found"), ("GET", "/../etc/passwd", 404,
                                                                               "not_found")])
def test_unknown_paths_and_methods_get_json_errors(client, method, path, status, code):
    r = client.request(method, path)
    assert_error(r, status, code)
    assert r.headers["content-type"] == "application/json"
    if status == 405:
        assert "POST" in r.headers["Allow"] or "GET" in r.headers["Allow"]


def test_a_body_over_the_limit_is_refused_by_its_length_and_while_it_streams(client, backend):
    big = json.dumps({"text": "x" * MAX_BODY}).encode()
    r = client.post("/v1/translate", content=big, headers={"Content-Type": "application/json"})
    assert_error(r, 413, "body_too_large", f"the limit is {MAX_BODY}")
    assert r.headers["Connection"] == "close"
    read = []

    def chunks():  # no Content-Length: chunked; the server stops reading past the limit
        for _ in range(100):
            read.append(1)
            yield b" " * 10000
    r = client.post("/v1/translate", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "body_too_large", f"more than {MAX_BODY} bytes")
    assert backend.submitted == []


def test_api_key(backend, metrics):
    app = build_app(backend, metrics, api_key="s3cret")
    with TestClient(app) as c:
        for method, path in [("POST", "/v1/translate"), ("GET", "/metrics"), ("GET", "/nowhere")]:
            for auth in [None, "Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret2", "bearer s3cret"]:
                r = c.request(method, path, json={"text": "a"}, headers={"Authorization": auth} if auth else {})
                assert_error(r, 401, "unauthorized")
                assert r.headers["WWW-Authenticate"] == "Bearer"
        assert backend.submitted == []
        assert c.get("/health").status_code == 200  # a load balancer's probe needs no key
        ok = c.post("/v1/translate", json={"text": "a"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json() == {"text": "A"}
        assert c.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_health_reports_the_backends_workers(client, backend):
    backend.health = lambda: {"status": "no_workers", "workers": 0, "workers_total": 2}
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "no_workers"
    backend.health = lambda: {"status": "ok", "workers": 1, "workers_total": 2}
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "workers": 1, "workers_total": 2}


def test_health_loading_then_ok(client, backend):
    backend.ready = False
    r = client.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "loading"}
    backend.ready = True
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


METRIC_NAMES = ["fa_requests_total", "fa_request_errors_total", "fa_request_latency_seconds_bucket",
                "fa_sentences_total", "fa_batch_rows_bucket", "fa_passes_total", "fa_pass_rows_total",
                "fa_pass_tokens_total", "fa_draft_position_drafted_total", "fa_draft_position_accepted_total",
                "fa_queue_length", "fa_workers"]


def test_metrics_count_requests(client):
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    before = r.text
    for name in METRIC_NAMES:
        assert name in before, name
    assert sample(before, "fa_draft_position_drafted_total", position="8") == 0
    assert (sample(before, "fa_requests_total", endpoint="translate") or 0) == 0

    assert client.post("/v1/translate", json={"text": "a"}).status_code == 200
    assert client.post("/v1/translate", json={"texts": ["a", "b", "c"]}).status_code == 200
    assert client.post("/v1/translate", json={"text": " "}).status_code == 400
    assert client.post("/v1/translate", content=b"{", headers={"Content-Type": "application/json"}).status_code == 400

    after = client.get("/metrics").text
    assert sample(after, "fa_requests_total", endpoint="translate") == 4
    assert sample(after, "fa_sentences_total") == 4
    assert sample(after, "fa_request_errors_total", code="empty_text") == 1
    assert sample(after, "fa_request_errors_total", code="bad_json") == 1
    assert sample(after, "fa_request_latency_seconds_count") == 4
    assert sample(after, "fa_request_latency_seconds_bucket", le="10.0") == 4
    assert sample(after, "fa_request_latency_seconds_sum") > 0


def test_decoding_counters_read_from_the_engine_at_each_scrape(metrics):
    from fairseq_aggressive.serving.metrics import decode_counters

    hist_a, hist_b = [0] * 65, [0] * 65
    hist_a[2], hist_a[3], hist_b[64] = 5, 5, 1
    a = dict(passes=10, sentence_passes=25, emitted=60, pass_rows=hist_a,
             position_drafted=[5, 4, 3, 2, 1, 1, 1, 1, 1, 1] + [0] * 22,
             position_accepted=[4, 3, 2, 1, 0, 0, 1, 1, 1, 0] + [0] * 22)
    b = dict(passes=1, sentence_passes=64, emitted=70, pass_rows=hist_b,
             position_drafted=[1] + [0] * 19 + [2] * 12, position_accepted=[1] + [0] * 19 + [1] * 12)
    counters = decode_counters([a, b])
    assert counters["passes"] == 11 and counters["position_drafted"][0] == 6
    source = {"now": None}
    metrics.set_decode_source(lambda: source["now"])
    text = metrics.render()[0].decode()
    assert sample(text, "fa_passes_total") == 0 and sample(text, "fa_batch_rows_count") == 0
    assert sample(text, "fa_draft_position_drafted_total", position="32") == 0  # every position shows, at 0
    source["now"] = counters
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    text = body.decode()
    assert sample(text, "fa_passes_total") == 11
    assert sample(text, "fa_pass_rows_total") == 89
    assert sample(text, "fa_pass_tokens_total") == 130
    assert sample(text, "fa_batch_rows_count") == 11
    assert sample(text, "fa_batch_rows_sum") == 5 * 2 + 5 * 3 + 64
    assert sample(text, "fa_batch_rows_bucket", le="1.0") == 0
    assert sample(text, "fa_batch_rows_bucket", le="2.0") == 5
    assert sample(text, "fa_batch_rows_bucket", le="4.0") == 10
    assert sample(text, "fa_batch_rows_bucket", le="32.0") == 10
    assert sample(text, "fa_batch_rows_bucket", le="64.0") == 11
    assert sample(text, "fa_draft_position_drafted_total", position="1") == 6
    assert sample(text, "fa_draft_position_accepted_total", position="1") == 5
    assert sample(text, "fa_draft_position_drafted_total", position="7") == 1
    assert sample(text, "fa_draft_position_drafted_total", position="10") == 1  # every position counted alone
    assert sample(text, "fa_draft_position_accepted_total", position="9") == 1
    assert sample(text, "fa_draft_position_drafted_total", position="21") == 2
    assert sample(text, "fa_draft_position_drafted_total", position="32") == 2
    assert sample(text, "fa_draft_position_accepted_total", position="32") == 1
    assert sample(text, "fa_draft_position_drafted_total", position="33") is None
    metrics.set_queue_length(7)
    metrics.set_workers(3)
    text = metrics.render()[0].decode()
    assert sample(text, "fa_queue_length") == 7
    assert sample(text, "fa_workers") == 3


def test_each_service_has_its_own_registry():
    a, b = ServiceMetrics(), ServiceMetrics()
    a.observe_request("translate", 0.01, 2)
    assert a.registry.get_sample_value("fa_sentences_total") == 2
    assert b.registry.get_sample_value("fa_sentences_total") == 0


def test_free_port_can_be_bound():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_run_server_on_a_taken_port_fails_and_shuts_the_backend_down():
    calls = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = run_server(build_app(FakeBackend(), ServiceMetrics()), "127.0.0.1", taken.getsockname()[1],
                          on_shutdown=lambda left: calls.append("shutdown"))
    assert code != 0
    assert calls == ["shutdown"]


# the served process: the fake backend on worker threads, each text taking DELAY seconds
SERVER_SCRIPT = r"""
import sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from fairseq_aggressive.serving.app import build_app
from fairseq_aggressive.serving.metrics import ServiceMetrics
from fairseq_aggressive.serving.server import run_server

DELAY = float(sys.argv[2])

class SlowBackend:
    ready = True
    def __init__(self):
        self.pool = ThreadPoolExecutor(8)
        self.answered = 0
        self.lock = threading.Lock()
    def submit(self, texts, request_id=""):
        print("submitted", texts[0], flush=True)
        return self.pool.submit(self.run, texts)
    def run(self, texts):
        time.sleep(DELAY)
        with self.lock:
            self.answered += 1
        return [t.upper() for t in texts]
    def shutdown(self, seconds_left):
        self.pool.shutdown(wait=True)
        print("backend shut down,", self.answered, "answered", flush=True)

backend = SlowBackend()
sys.exit(run_server(build_app(backend, ServiceMetrics()), "127.0.0.1", int(sys.argv[1]), backend.shutdown))
"""


def test_sigterm_answers_requests_in_flight_then_shuts_the_backend_down(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SERVER_SCRIPT)
    port, delay, n = free_port(), 2.0, 4
    proc = subprocess.Popen([sys.executable, str(script), str(port), str(delay)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen = []

    def wait_for(predicate, timeout):
        deadline = time.monotonic() + timeout
        while not predicate():
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError("the server did not get there; its output:\n" + "\n".join(seen))
            seen.append(line)

    try:
        wait_for(lambda: any(s.startswith("serving on ") for s in seen), 60)
        url = next(s for s in seen if s.startswith("serving on ")).split()[-1]
        assert url == f"http://127.0.0.1:{port}"

        results = {}

        def ask(i):
            with httpx.Client(timeout=30) as c:
                r = c.post(url + "/v1/translate", json={"text": f"text {i}"})
                results[i] = (r.status_code, r.json(), time.monotonic())

        clients = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
        for t in clients:
            t.start()
        wait_for(lambda: sum(s.startswith("submitted") for s in seen) == n, 20)  # all in flight
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # new connections are refused while the requests in flight are still being answered
        refused = None
        while time.monotonic() - signalled < delay / 2:
            with socket.socket() as s:
                try:
                    s.connect(("127.0.0.1", port))
                except ConnectionRefusedError:
                    refused = time.monotonic()
                    break
            time.sleep(0.05)
        assert refused is not None, "the server still accepted connections after SIGTERM"
        assert not results, "the requests in flight were answered before the server stopped listening"

        for t in clients:
            t.join(30)
        assert {i: r[:2] for i, r in results.items()} == {i: (200, {"text": f"TEXT {i}"}) for i in range(n)}
        assert proc.wait(30) == 0
        rest = []
        while True:
            line = lines.get(timeout=10)
            if line is None:
                break
            rest.append(line)
        seen.extend(rest)
        assert f"backend shut down, {n} answered" in seen, "\n".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
