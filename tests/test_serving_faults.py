"""The server's backend on the shipped GEC model under faults: an engine error
pinned on one sentence (the test library's fault hook) fails that sentence's
request alone while every other request is answered with its greedy output; a
worker that dies is started again with the sentences it held; workers that
keep dying fail the backend (health 503, on_fatal); a request cancelled while
queued or decoding leaves the queue and the running batch."""
import random
import threading
import time

import pytest

from helpers import needs_native, sample_lines

pytestmark = needs_native

MODEL = "models/uagec-9x3"


@pytest.fixture(scope="module")
def lines():
    return sample_lines(48)


@pytest.fixture(scope="module")
def reference(lines):
    from fairseq_aggressive.translator import Translator

    engine = Translator.from_pretrained(MODEL, decoding="iad", max_draft_len=0)
    return {s: engine.translate_static([s])[0] for s in lines}


@pytest.fixture
def test_engine(monkeypatch):
    """Engines made in this test load the test library; its fault hook, off again afterwards."""
    from fairseq_aggressive.native import build, engine as native_engine

    monkeypatch.setattr(native_engine, "library", lambda isa=None: build.test_library(isa))
    lib = build.test_library()
    yield lib
    lib.fa_set_run_fault_token(-1)


def _poison(backend, lines):
    """A sentence and a token of its copy source that no other sentence's holds."""
    copies = {s: set(backend.prepare(0, s).copy) for s in lines}
    for s in lines[::-1]:
        others = set().union(*(c for t, c in copies.items() if t != s))
        only = sorted(copies[s] - others)
        if only:
            return s, only[0]
    raise AssertionError("no sentence has a token of its own")


def _clients(backend, lines, n_clients, rounds, seed, must=None):
    """Concurrent clients (more threads than cores), each submitting random
    subsets of ``lines`` (``must`` in some); (texts, outputs or the exception)."""
    results = []

    def client(i):
        rng = random.Random(seed + i)
        for r in range(rounds):
            texts = rng.sample(lines, rng.randint(1, 6))
            if must is not None and (i + r) % 3 == 0 and must not in texts:
                texts.insert(rng.randrange(len(texts) + 1), must)
            try:
                results.append((texts, backend.submit(texts).future.result(timeout=120)))
            except Exception as e:  # noqa: BLE001  (checked by the caller)
                results.append((texts, e))
            time.sleep(rng.random() * 0.01)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return results


def test_an_engine_fault_fails_only_the_sentence_it_is_pinned_on(test_engine, lines, reference):
    from fairseq_aggressive.serving.backend import DecodeBackend
    from fairseq_aggressive.serving.metrics import ServiceMetrics
    from fairseq_aggressive.serving.scheduler import EngineFault

    metrics = ServiceMetrics()
    backend = DecodeBackend(MODEL, workers=2, native_threads=1, max_batch=8, metrics=metrics)
    try:
        poison, token = _poison(backend, lines)
        test_engine.fa_set_run_fault_token(token)
        results = _clients(backend, lines, n_clients=8, rounds=4, seed=1, must=poison)
    finally:
        test_engine.fa_set_run_fault_token(-1)
        left = backend.close()
    assert left == 0 and len(results) == 32
    bad = [(t, o) for t, o in results if poison in t]
    good = [(t, o) for t, o in results if poison not in t]
    assert bad and good
    for texts, out in bad:
        assert isinstance(out, EngineFault), out
    for texts, out in good:  # decoded again after the batch failed: still each sentence's greedy output
        assert out == [reference[s] for s in texts]
    assert metrics.registry.get_sample_value("fa_engine_faults_total") == len(bad)
    assert metrics.registry.get_sample_value("fa_worker_restarts_total") == 0
    assert backend.health()["status"] == "shutting_down"


def test_a_worker_that_dies_is_started_again_with_what_it_held(test_engine, lines, reference):
    from fairseq_aggressive.serving.backend import DecodeBackend
    from fairseq_aggressive.serving.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    backend = DecodeBackend(MODEL, workers=1, native_threads=1, max_batch=8, metrics=metrics)
    worker = backend.workers[0]
    poison, token = _poison(backend, lines)
    real = worker.make_batch
    calls = []

    def failing_once():  # the rebuild after the engine error raises: the worker dies
        calls.append(1)
        if len(calls) == 1:
            test_engine.fa_set_run_fault_token(-1)
            raise MemoryError("no memory for a new batch")
        return real()

    worker.make_batch = failing_once
    try:
        test_engine.fa_set_run_fault_token(token)
        results = _clients(backend, [s for s in lines if s != poison] + [poison], n_clients=6, rounds=3, seed=7,
                           must=poison)
        health = backend.health()
    finally:
        test_engine.fa_set_run_fault_token(-1)
        left = backend.close()
    assert left == 0
    # every request is answered, the poisoned ones too (the fault went away with the dead worker)
    for texts, out in results:
        assert out == [reference[s] for s in texts], (texts, out)
    assert metrics.registry.get_sample_value("fa_worker_restarts_total") == 1
    assert health == {"status": "ok", "workers": 1, "workers_total": 1}


def test_workers_that_keep_dying_fail_the_backend(test_engine, lines):
    from fairseq_aggressive.serving import backend as backend_mod
    from fairseq_aggressive.serving.backend import DecodeBackend

    fatal = threading.Event()
    backend = DecodeBackend(MODEL, workers=1, native_threads=1, max_batch=4, on_fatal=fatal.set)
    poison, token = _poison(backend, lines)

    def broken():
        raise RuntimeError("the engine cannot make a batch")

    backend.workers[0].make_batch = broken
    try:
        test_engine.fa_set_run_fault_token(token)
        request = backend.submit([poison, lines[0]])
        assert fatal.wait(30), "the backend did not give up"
        with pytest.raises(Exception):
            request.future.result(timeout=10)
        assert backend.failed and backend.health()["status"] == "failed"
        assert len(backend.restarts) == backend_mod.MAX_RESTARTS + 1
    finally:
        test_engine.fa_set_run_fault_token(-1)
        backend.close(5)


def test_cancelled_requests_leave_the_queue_and_the_batch(lines, reference):
    from fairseq_aggressive.serving.backend import DecodeBackend
    from fairseq_aggressive.serving.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    backend = DecodeBackend(MODEL, workers=1, native_threads=1, max_batch=8, metrics=metrics)
    try:
        doomed = backend.submit(lines[:40])  # 8 decode, 32 wait
        time.sleep(0.02)
        assert doomed.cancel("client_closed")
        kept = backend.submit(lines[40:46])
        assert kept.future.result(timeout=60) == [reference[s] for s in lines[40:46]]
        dropped = {w: metrics.registry.get_sample_value("fa_sentences_dropped_total", {"where": w})
                   for w in ("queued", "decoding")}
        stats = backend.workers[0].batch.stats()
    finally:
        backend.close()
    # at most the rows that finished in the pass under way were decoded after the cancel
    assert dropped["queued"] >= 30 and dropped["decoding"] >= 1
    assert 40 - sum(o is not None for o in doomed.outputs) == dropped["queued"] + dropped["decoding"]
    assert stats.dropped == dropped["decoding"]


def test_the_queue_refuses_what_would_pass_its_limit_and_drops_gone_requests():
    from fairseq_aggressive.serving.scheduler import Item, Request, WorkQueue

    dropped = []
    q = WorkQueue(5, on_dropped=dropped.append)
    a, b = Request(["x"] * 3), Request(["y"] * 2)
    assert q.put_all([Item(a, i, None) for i in range(3)]) and q.put_all([Item(b, i, None) for i in range(2)])
    assert not q.put_all([Item(Request(["z"]), 0, None)]) and len(q) == 5  # none of it queued
    a.cancel("client_closed")
    got = q.take(10, wait=0)
    assert [it.request for it in got] == [b, b] and dropped == [3] and len(q) == 0
    q.put_front(got)  # a dead worker's items come first, whatever the limit
    q.put_all([Item(Request(["w"] * 3), i, None) for i in range(3)])
    assert [it.request for it in q.take(2, wait=0)] == [b, b]


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_a_server_whose_workers_keep_dying_stops_with_status_3(tmp_path):
    import os
    import subprocess
    import sys

    from fairseq_aggressive.serving.server import free_port

    script = tmp_path / "serve.py"
    script.write_text("import sys\n"
                      "from fairseq_aggressive.serving import scheduler\n"
                      "def broken(self):\n"
                      "    raise RuntimeError('injected: no batch can be made')\n"
                      "scheduler.ContinuousWorker._new_batch = broken\n"
                      "from fairseq_aggressive.serving.cli import main\n"
                      "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, str(script), MODEL, "--port", str(free_port())], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "the workers kept dying" in out and "no worker is started again" in out
