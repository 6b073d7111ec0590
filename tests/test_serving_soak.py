"""The whole server from the command line on the shipped GEC model, soaked:
32 clients for a minute (FA_SOAK_SECONDS) over loopback mix good requests with
every hostile kind of tests/hostile.py, random disconnects, requests of random
words, and requests holding a sentence the engine fails on (the test
library's fault hook), while one worker dies once.  Then: every good answer
equals greedy, no 5xx but the faulty sentence's own (a JSON 500 that names
nothing), /health answered throughout, the queue back to 0, the server's
resident memory grown by less than 50 MB, and a clean drain (exit 0)."""
import http.client
import json
import os
import random
import signal
import string
import subprocess
import sys
import threading
import time

import pytest

import hostile
from helpers import needs_native, sample_lines

pytestmark = [needs_native, pytest.mark.soak, pytest.mark.timeout(600)]

MODEL = "models/uagec-9x3"
SECONDS = float(os.environ.get("FA_SOAK_SECONDS", "60"))
CLIENTS = 32
TIMEOUTS = 1.0  # --header-timeout and --body-timeout
MAX_BODY = 100_000

# the server: the test library's engines, a fault pinned on one token, and the
# second failed batch's worker dying before it decodes its sentences again
SERVER = r"""
import sys
from fairseq_aggressive.native import build, engine
engine.library = lambda isa=None: build.test_library(isa)
build.test_library().fa_set_run_fault_token(int(sys.argv[1]))
from fairseq_aggressive.serving import scheduler
isolate, failures = scheduler.ContinuousWorker._isolate, []
def dying_isolate(self, error):
    failures.append(1)
    if len(failures) == 2:
        raise MemoryError("injected: the worker dies")
    return isolate(self, error)
scheduler.ContinuousWorker._isolate = dying_isolate
from fairseq_aggressive.serving.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS")).split()[1])


def _metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name))


def test_soak(tmp_path):
    from fairseq_aggressive.serving.backend import DecodeBackend
    from fairseq_aggressive.serving.server import free_port
    from fairseq_aggressive.translator import Translator

    lines = sample_lines(80)
    probe = DecodeBackend(MODEL, workers=1, native_threads=1)
    copies = {s: set(probe.prepare(0, s).copy) for s in lines}
    probe.close()
    poison, token = next((s, min(copies[s] - set().union(*(c for t, c in copies.items() if t != s))))
                         for s in lines if copies[s] - set().union(*(c for t, c in copies.items() if t != s)))
    good_lines = [s for s in lines if s != poison]
    ref = Translator.from_pretrained(MODEL, decoding="iad", max_draft_len=0)
    reference = {s: ref.translate_static([s])[0] for s in good_lines}

    script = tmp_path / "serve.py"
    script.write_text(SERVER)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(token), MODEL, "--port", str(port), "--workers", "2",
                             "--native-threads", "1", "--header-timeout", str(TIMEOUTS), "--body-timeout",
                             str(TIMEOUTS), "--max-body-bytes", str(MAX_BODY), "--max-connections", "200",
                             "--request-timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log = []
    for line in proc.stdout:
        log.append(line)
        if "serving on" in line:
            break
    reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)
    reader.start()
    assert any("serving on" in x for x in log), "".join(log)

    cases = hostile.cases(TIMEOUTS, TIMEOUTS, MAX_BODY)
    problems, counts, lock = [], {}, threading.Lock()
    health = []
    stop = threading.Event()

    def note(kind, problem=None):
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if problem is not None:
                problems.append((kind, problem))

    def post(conn, payload):
        """The answer; a request that meets a keep-alive connection the server closed
        while idle is sent again once on a new one, as HTTP clients do."""
        for attempt in range(2):
            try:
                conn.request("POST", "/v1/translate", json.dumps(payload), {"Content-Type": "application/json"})
                return conn.getresponse()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                conn.close()
                if attempt:
                    raise
                note("reconnected")

    def good(rng, conn, with_poison=False):
        texts = rng.sample(good_lines, rng.randint(1, 4))
        if with_poison:
            texts.insert(rng.randrange(len(texts) + 1), poison)
        r = post(conn, {"texts": texts})
        body = json.loads(r.read())
        if with_poison:
            ok = r.status == 500 and body["error"] == {"code": "internal", "message": "internal error",
                                                       "request_id": body["error"]["request_id"]}
            note("poisoned", None if ok else (r.status, body))
        else:
            ok = r.status == 200 and body == {"texts": [reference[s] for s in texts]}
            note("good", None if ok else (texts, r.status, body))

    def random_words(rng, conn):
        text = " ".join("".join(rng.choice(string.ascii_lowercase + "абвгдежзийклмнопрстуфхцчшщьюя")
                                for _ in range(rng.randint(3, 12))) for _ in range(rng.randint(1, 30)))
        r = post(conn, {"text": text})
        r.read()
        note("random_words", None if r.status in (200, 413) else r.status)

    def client(seed):
        rng = random.Random(seed)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not stop.is_set():
            roll = rng.random()
            try:
                if roll < 0.50:
                    good(rng, conn)
                elif roll < 0.54:
                    good(rng, conn, with_poison=True)
                elif roll < 0.62:
                    random_words(rng, conn)
                elif roll < 0.72:
                    hostile.vanish_after_request(port, rng.sample(good_lines, rng.randint(1, 8)),
                                                 wait=rng.random() * 0.02)
                    note("vanished")
                else:
                    name = rng.choice(sorted(cases))
                    out = cases[name](port)
                    note(name, None if hostile.acceptable(out) and out.status != -1 else out)
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                note("client_error", repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()

    def probe_health():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not stop.is_set():
            t0 = time.perf_counter()
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            health.append((time.perf_counter() - t0, r.status))
            time.sleep(0.1)
        c.close()

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        threads.append(threading.Thread(target=probe_health))
        for t in threads:
            t.start()
        time.sleep(min(5.0, SECONDS / 4))
        rss_start = _rss_kb(proc.pid)
        time.sleep(max(0.0, SECONDS - min(5.0, SECONDS / 4)))
        stop.set()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client is stuck"
        rss_end = _rss_kb(proc.pid)
        time.sleep(0.5)
        queued = _metric(port, "fa_queue_length")
        restarts = _metric(port, "fa_worker_restarts_total")
        faults = _metric(port, "fa_engine_faults_total")
        dropped = _metric(port, "fa_sentences_dropped_total")
        internal = _metric(port, 'fa_request_errors_total{code="internal"}')
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    text = "".join(log)
    print(f"soak: {SECONDS:g} s, {CLIENTS} clients; {sorted(counts.items())}; /health max "
          f"{1000 * max(h[0] for h in health):.1f} ms over {len(health)}; RSS {rss_start // 1024} -> "
          f"{rss_end // 1024} MB; restarts {restarts:g}, faults {faults:g}, dropped {dropped:g}")
    assert not problems, problems[:5]
    assert counts.get("good", 0) > 100 and counts.get("poisoned", 0) > 0 and counts.get("vanished", 0) > 0
    assert counts.get("client_error", 0) == 0
    assert internal == counts["poisoned"] == faults  # no 5xx but the faulty sentence's own
    assert restarts == 1 and "decoder-" in text and "died" in text
    assert all(status == 200 for _, status in health) and max(h[0] for h in health) < 1.0
    assert queued == 0
    assert rss_end - rss_start < 50 * 1024, (rss_start, rss_end)
    assert code == 0 and "stopped: 0 sentence(s) unanswered" in text, text[-2000:]
