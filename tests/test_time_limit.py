"""The suite's guard against hangs (pytest.ini): a test that never returns, in
Python or inside a C call, fails once its time limit passes, printing the stack
of every thread, and its process ends instead of waiting."""
import subprocess
import sys
import textwrap
import time

HANGS = textwrap.dedent('''
    import ctypes
    import threading


    def test_never_returns():
        ready = threading.Event()
        threading.Thread(target=ready.wait, name="a-waiting-helper", daemon=True).start()
        ctypes.CDLL(None).sleep(600)  # a C call that does not come back in time
''')


def test_the_suite_limits_every_test(pytestconfig):
    # the thread method: a signal would wait for the C call to return
    assert pytestconfig.getini("timeout_method") == "thread"
    assert 0 < float(pytestconfig.getini("timeout")) <= 900


def test_a_test_that_hangs_fails_with_every_threads_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGS)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "timeout=3", "-o", "timeout_method=thread", "test_hang.py"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert took < 120, took  # seconds after the limit, not the 600 s of the call
    assert "Timeout" in out, out[-3000:]
    # the stacks of the test's thread (in the C call) and of the thread beside it
    assert "test_never_returns" in out and "sleep" in out and "a-waiting-helper" in out, out[-3000:]
