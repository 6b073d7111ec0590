"""The tests' Python commands forked from a warm interpreter (warm_python.py)
give what ``subprocess.run`` gives: the same output, exit status, streams,
working directory and environment, tracebacks, deaths by signal, atexit
handlers and threads at exit, timeouts; what it does not take runs as a
process of its own."""
import os
import subprocess
import sys
import time

import pytest

import warm_python
from helpers import ROOT, tool

SCRIPT = r'''
import atexit, os, sys, threading, time
print("warm" if "xml.dom.minidom" in sys.modules else "cold")
print(__name__, sys.argv[1:], os.getcwd(), os.environ.get("PROBE"), sys.path[0] == os.path.dirname(__file__))
print("stdin:", sys.stdin.read().replace("\n", "|"))
print("to stderr", file=sys.stderr)
sys.stdout.write("a\r\nb\rc\n")
what = sys.argv[1]
atexit.register(lambda: print("atexit ran", flush=True))
if what == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True))).start()
elif what == "raise":
    raise ValueError("a bad value")
elif what == "kill":
    sys.stdout.flush()
    os.kill(os.getpid(), 9)
elif what == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture(scope="module")
def server():
    env = dict(os.environ, PROBE="p1")
    s = warm_python.Server(env, preload=("xml.dom.minidom",))  # (the tests' server preloads torch and fairseq)
    assert s.is_ready(60)
    yield s, env
    s.close()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return str(path)


def both(server, cmd, **kw):
    s, env = server
    assert s.takes(cmd, env)
    warm = s.run(cmd, env, str(ROOT), **kw)
    cold = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), **kw)
    return warm, cold


@pytest.mark.parametrize("what,code", [("exit", 0), ("exit", 3), ("thread", 0), ("raise", 0), ("kill", 0)])
def test_a_command_gives_what_its_own_process_gives(server, script, what, code):
    warm, cold = both(server, [sys.executable, script, what, str(code)], input="x\ny\n")
    assert warm.stdout.splitlines()[0] == "warm" and cold.stdout.splitlines()[0] == "cold"
    assert warm.stdout.splitlines()[1:] == cold.stdout.splitlines()[1:]
    assert warm.returncode == cold.returncode == {"raise": 1, "kill": -9}.get(what, code)
    assert f"['{what}', '{code}'] {ROOT} p1 True" in warm.stdout and "stdin: x|y" in warm.stdout
    assert "a\nb\nc\n" in warm.stdout  # newlines as text mode reads them
    if what == "thread":
        assert warm.stdout.index("thread joined") < warm.stdout.index("atexit ran")
    if what == "raise":
        assert "Traceback" in warm.stderr and warm.stderr.rstrip().endswith("ValueError: a bad value")
        assert cold.stderr.rstrip().endswith("ValueError: a bad value")
    else:
        assert warm.stderr == cold.stderr == "to stderr\n"


def test_a_command_past_its_time_is_killed(server, script):
    s, env = server
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        s.run([sys.executable, script, "sleep", "0"], env, str(ROOT), timeout=1)
    assert time.monotonic() - start < 10
    assert "warm" in info.value.output
    again = s.run([sys.executable, script, "exit", "5"], env, str(ROOT))  # the server goes on
    assert again.returncode == 5


def test_what_it_does_not_take_runs_as_its_own_process(server, script, monkeypatch):
    s, env = server
    assert not s.takes([sys.executable, "-c", "pass"], env)
    assert not s.takes([sys.executable, script], dict(env, PROBE="p2"))  # another environment
    assert not s.takes(["/bin/echo", "x"], env)
    assert s.takes([sys.executable, script], dict(env, PYTEST_CURRENT_TEST="another test"))
    monkeypatch.setattr(warm_python, "_servers", {})
    seen = set()
    monkeypatch.setattr(warm_python, "PRELOAD", ("xml.dom.minidom",))
    monkeypatch.setenv("FAIRSEQ_AGGRESSIVE_TESTS_FORK", "0")
    off = warm_python.run([sys.executable, script, "exit", "0"], env, str(ROOT))
    assert off.stdout.startswith("cold") and not warm_python._servers
    monkeypatch.delenv("FAIRSEQ_AGGRESSIVE_TESTS_FORK")
    cold = warm_python.run([sys.executable, "-c", "import sys; print('fairseq' in sys.modules)"], env, str(ROOT))
    assert cold.stdout == "False\n" and not warm_python._servers
    try:  # a server for each environment commands come with; commands run cold until it is ready
        for probe in ("p2", "p3", "p2", "p3"):
            got = warm_python.run([sys.executable, script, "exit", "0"], dict(env, PROBE=probe), str(ROOT))
            assert f" {probe} " in got.stdout
            for each in warm_python._servers.values():
                assert each.is_ready(60)
            assert got.stdout.startswith("warm" if probe in seen else "cold")
            seen.add(probe)
        assert len(warm_python._servers) == 2
        got = warm_python.run([sys.executable, script, "exit", "0"], dict(env, PROBE="p4"), str(ROOT))
        assert got.stdout.startswith("cold") and len(warm_python._servers) == warm_python.MAX_SERVERS == 2
        server = next(iter(warm_python._servers.values()))
        with server.busy:  # a command beside one the server runs (another thread's) starts its own process
            got = warm_python.run([sys.executable, script, "exit", "0"], server.env, str(ROOT))
        assert got.stdout.startswith("cold")
        got = warm_python.run([sys.executable, script, "exit", "0"], server.env, str(ROOT))
        assert got.stdout.startswith("warm")
    finally:
        for each in warm_python._servers.values():
            each.close()


LOGS_FIRST = """import logging, sys
logging.basicConfig(format="%(name)s | %(levelname)s | %(message)s", level=logging.INFO, stream=sys.stdout)
import fairseq
logging.getLogger("probe").info("configured first")
"""
LOGS_AFTER = """import logging, sys
import fairseq
logging.basicConfig(format="%(name)s | %(levelname)s | %(message)s", level=logging.INFO, stream=sys.stdout)
logging.getLogger("probe").info("configured after fairseq's import")
"""


def _without_import_notes(text):  # (what fairseq's import logs, once, in the server)
    return [line for line in text.splitlines() if "tensorboardX" not in line]


@pytest.mark.slow  # (fairseq's imports in processes of their own)
def test_commands_that_import_fairseq(tmp_path):
    env = dict(os.environ)
    s = warm_python.Server(env)
    try:
        assert s.is_ready(120)
        seconds = {}
        for name, code in (("first", LOGS_FIRST), ("after", LOGS_AFTER)):  # logging as its own process has it
            (tmp_path / f"{name}.py").write_text(code)
            cmd = [sys.executable, str(tmp_path / f"{name}.py")]
            start = time.monotonic()
            warm = s.run(cmd, env, str(ROOT))
            seconds["warm"] = time.monotonic() - start
            cold = subprocess.run(cmd, capture_output=True, text=True, env=env)
            seconds["cold"] = time.monotonic() - start - seconds["warm"]
            assert warm.returncode == cold.returncode == 0, (warm.stderr, cold.stderr)
            assert _without_import_notes(warm.stdout) == _without_import_notes(cold.stdout), name
            assert _without_import_notes(warm.stderr) == _without_import_notes(cold.stderr), name
            assert ("probe | INFO | configured first" in warm.stdout) == (name == "first")
        # (the imports made before the command: what it is for)
        assert seconds["warm"] < seconds["cold"] / 2, seconds
        cmd = [tool("fairseq-aggressive-translate"), "--help"]  # a console script (its parser imports no torch)
        assert s.takes(cmd, env)
        warm = s.run(cmd, env, str(ROOT))
        cold = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    finally:
        s.close()
    assert warm.returncode == cold.returncode == 0
    assert warm.stdout == cold.stdout and "usage: fairseq-aggressive-translate" in warm.stdout
