import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

# torch's threads per test process: 2, or under pytest-xdist (make test runs one worker per CPU)
# the workers' share of the CPUs: OpenMP threads that outnumber the cores spin-wait for each other
# on every small product. The fairseq tools the tests start get the same count.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch_threads = int(os.environ.get("TEST_THREADS", max(1, min(2, (os.cpu_count() or 1) // _workers))))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
# the native engine on 2 threads: its thread pool takes part in every exactness test (the
# default policy gives small test models one thread; tests/test_threads.py checks it)
os.environ.setdefault("FAIRSEQ_AGGRESSIVE_NATIVE_THREADS", os.environ.get("TEST_THREADS", "2"))


def _xdist_controller(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config):
    """torch's threads in the processes that run tests (the xdist controller, which runs none,
    starts its workers without importing torch)."""
    if not _xdist_controller(config):
        import torch

        torch.set_num_threads(torch_threads)


def pytest_sessionstart(session):
    """The engine's test library, which many tests load, starts building at once in the
    background (where the engine cache lacks it): the worker that takes the cache's lock
    builds it while the other runs its tests, and a test waits only when it needs it."""
    if os.environ.get("FAIRSEQ_AGGRESSIVE_NO_NATIVE") or _xdist_controller(session.config):
        return  # (no engine; or the xdist controller, which runs no test)
    # imported here, in the main thread: fairseq's imports are not safe to run beside collection's
    from fairseq_aggressive.native import build as native_build

    def build():
        try:
            native_build.test_library()
        except Exception:  # (the tests that need it say why)
            pass

    threading.Thread(target=build, name="test-library-build", daemon=True).start()


def _comparison_totals():
    helpers = sys.modules.get("helpers")  # (a process that never imported it compared nothing,
    if helpers is None:                   # as the xdist controller, which would import torch and fairseq)
        return [0, 0, 0, 0]
    comps = helpers.ALL_COMPARISONS
    return [sum(c.total for c in comps), sum(c.identical for c in comps),
            sum(c.near_ties for c in comps), sum(len(c.failures) for c in comps)]


# With pytest-xdist (make test runs one worker per CPU, each test file on one worker) every
# worker counts its own comparisons and hands them to the controller, which prints the sum.
_WORKER_TOTALS = []


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker
        session.config.workeroutput["comparisons"] = _comparison_totals()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    totals = getattr(node, "workeroutput", {}).get("comparisons")
    if totals:
        _WORKER_TOTALS.append(totals)


def pytest_terminal_summary(terminalreporter):
    tot, ident, ties, bad = [sum(col) for col in zip(_comparison_totals(), *_WORKER_TOTALS)]
    if tot:
        terminalreporter.write_line(
            f"equivalence with stock greedy: {tot} hypotheses compared, {ident} identical "
            f"(tokens and scores), {ties} genuine near-ties, {bad} other differences"
        )


# ---------------------------------------------- models trained on the sample
# (minutes: the tests that use them are marked slow)




def _once(tmp_path_factory, name, build):
    """``build(directory)`` run once per test session, its (JSON) result kept:
    under pytest-xdist the workers share the directory and the first one
    builds while the others wait for it (a file lock), so the session's
    models are trained once however many workers use them."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above the workers' own
    work = root / f"shared-{name}"
    result = work / "result.json"
    with FileLock(str(work) + ".lock"):
        if not result.exists():
            shutil.rmtree(work, ignore_errors=True)  # an earlier worker's attempt that failed
            work.mkdir()
            value = build(work)
            result.write_text(json.dumps(value))
    return json.loads(result.read_text())


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny deep/shallow model trained for a few hundred updates on the sample
    (tests/tiny_model.py: the kept one where it is the recipe's): (data, checkpoint)."""
    import tiny_model

    def build(work):
        data_bin = tiny_model.prepare(work / "data")
        save = work / "ckpt"
        if not tiny_model.from_kept("ar", data_bin, save):
            tiny_model.train("ar", data_bin, save)
        return [str(data_bin), str(save / "checkpoint_last.pt")]

    return tuple(Path(p) for p in _once(tmp_path_factory, "cli", build))


def _built_on_trained(name, trained, tmp_path_factory):
    import tiny_model

    def build(save):
        data, ar = trained
        if not tiny_model.from_kept(name, data, save, ar):
            tiny_model.train(name, data, save, ar)
        return str(save / "checkpoint_last.pt")

    return Path(_once(tmp_path_factory, name, build))


@pytest.fixture(scope="session")
def trained_drafter(trained, tmp_path_factory):
    """A block_nat drafter (k=4) trained with glat_block_loss on the same data, its
    encoder initialised from the AR model's (the kept one where it is the recipe's)."""
    return _built_on_trained("drafter", trained, tmp_path_factory)


@pytest.fixture(scope="session")
def trained_blockwise(trained, tmp_path_factory):
    """Proposal heads (k=4) trained on top of the frozen AR model of ``trained``
    (the paper's 'regular' setting: only the new layer trains; the kept one where
    it is the recipe's): decoded exactly, the result must be that AR model's greedy output."""
    return _built_on_trained("blockwise", trained, tmp_path_factory)


@pytest.fixture(scope="session")
def trained_greedy(trained, tmp_path_factory):
    """fairseq-generate's greedy output of ``trained`` on the test split (helpers.generate's
    defaults), made once for the session: {sentence id: hypothesis}."""
    from helpers import generate

    def build(work):
        return generate(*trained)[0]

    return {int(k): v for k, v in _once(tmp_path_factory, "greedy", build).items()}
