"""The tests' Python commands (fairseq-generate, the bench, a script of scripts/)
in processes forked from one that has imported torch and fairseq: each command
is a process of its own, with its arguments, environment, working directory,
standard streams and exit status, as ``subprocess.run`` gives them, without
the five seconds of imports every such process spends before its work.

A command runs here when it is a Python script started by this interpreter
(``[sys.executable, "script.py", ...]``) or a console script of this
environment (a file whose first line runs this interpreter), with the
environment the server started with (give or take ``PYTEST_CURRENT_TEST``):
variables a Python process reads as it starts are then the same. The first
such command starts the server and runs as a process of its own, as does every
command until the server has made its imports, and a command started while
another runs in it (from another thread). Anything else
(``-c``, ``-m``, another interpreter, another environment) and every command
when ``FAIRSEQ_AGGRESSIVE_TESTS_FORK=0`` goes to ``subprocess.run``.

The server (this file run as a program) imports what ``fairseq_cli``'s
commands import first (numpy, torch, omegaconf, fairseq) and nothing of this
package, then waits for requests on a pipe; for each it forks a child which
takes the request's working directory, environment and streams (files on
descriptors 0, 1 and 2, so that handlers made on import write there too) and
runs the script as ``__main__`` (``runpy.run_path``). The child then leaves
the way an interpreter leaves a script: ``SystemExit`` as the exit status, an
exception's traceback on stderr and status 1, non-daemon threads joined and
``atexit`` handlers run. The server sends the child's pid, then its exit
status as ``subprocess`` reports it (minus the signal that killed it).
Forking a process that has only imported torch and numpy is what torch's own
data loader workers do; no thread of the engine exists in the server (this
package is not imported there).
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

PRELOAD = ("numpy", "torch", "omegaconf", "fairseq", "fairseq.checkpoint_utils", "fairseq.options",
           "fairseq.tasks", "fairseq.utils")
PASS_THROUGH = ("PYTEST_CURRENT_TEST",)  # may differ between the server's environment and a command's


def script_of(cmd):
    """(script, argv) where ``cmd`` runs a Python script with this interpreter; else None."""
    if not cmd:
        return None
    if cmd[0] == sys.executable:
        if len(cmd) > 1 and cmd[1].endswith(".py") and os.path.isfile(cmd[1]):
            return cmd[1], list(cmd[1:])
        return None
    try:
        with open(cmd[0], "rb") as f:
            first = f.readline().strip()
    except OSError:
        return None
    if first.startswith(b"#!"):  # (python or python3 of this environment)
        interpreter = os.fsdecode(first[2:])
        if os.path.dirname(interpreter) == os.path.dirname(sys.executable) and \
                os.path.realpath(interpreter) == os.path.realpath(sys.executable):
            return cmd[0], list(cmd)
    return None


def _comparable(env):
    return {k: v for k, v in env.items() if k not in PASS_THROUGH}


def _translate_newlines(data: bytes) -> str:  # as subprocess's text mode reads a stream
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


class Server:
    """One forking server; :meth:`run` is ``subprocess.run(cmd, capture_output=True,
    text=True, env=env, cwd=cwd, input=..., timeout=...)`` for commands it takes."""

    def __init__(self, env, preload=PRELOAD):
        self.env = dict(env)
        to_server, self._req = os.pipe()
        self._rep, from_server = os.pipe()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(to_server), str(from_server),
                                      ",".join(preload)],
                                     pass_fds=(to_server, from_server), env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_server)
        os.close(from_server)
        self._buf = b""
        self.ready = False
        self.busy = threading.Lock()  # one command at a time; a command beside it starts its own process

    def is_ready(self, timeout=0.0) -> bool:
        """Whether the server has made its imports (waiting up to ``timeout`` seconds for them)."""
        if not self.ready and self.proc.poll() is None:
            try:
                self.ready = self._reply(timeout) == {"ready": True}
            except RuntimeError:  # (it ended: commands start processes of their own)
                return False
        return self.ready

    def takes(self, cmd, env):
        return self.proc.poll() is None and script_of(cmd) is not None and _comparable(env) == _comparable(self.env)

    def _reply(self, timeout=None):
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self._rep], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._rep, 4096)
            if not chunk:
                raise RuntimeError("the warm Python server ended")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, cmd, env, cwd, input=None, timeout=None):
        self.is_ready(None)
        script, argv = script_of(cmd)
        with tempfile.TemporaryDirectory(prefix="warm-") as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("in", "out", "err")}
            with open(paths["in"], "w", encoding="utf-8") as f:
                f.write(input or "")
            req = dict(script=script, argv=argv, env=dict(env), cwd=cwd, **paths)
            os.write(self._req, (json.dumps(req) + "\n").encode())
            pid = self._reply()["pid"]
            status = self._reply(timeout)
            if status is None:  # as subprocess.run: the command killed, then TimeoutExpired
                os.kill(pid, signal.SIGKILL)
                self._reply()
            with open(paths["out"], "rb") as f:
                out = _translate_newlines(f.read())
            with open(paths["err"], "rb") as f:
                err = _translate_newlines(f.read())
        if status is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(cmd, status["status"], out, err)

    def close(self):
        os.close(self._req)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._rep)


_servers = {}  # one per environment that commands came with (the tests' commands come with one)
MAX_SERVERS = 2  # (a test that changes the environment for its commands runs them as before)


def run(cmd, env, cwd, **kw):
    """``subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, **kw)``,
    in a forked process where the command is a script a server takes."""
    if os.environ.get("FAIRSEQ_AGGRESSIVE_TESTS_FORK", "1") != "0" and set(kw) <= {"input", "timeout"} \
            and script_of(cmd) is not None:
        key = json.dumps(_comparable(env), sort_keys=True)
        server = _servers.get(key)
        if server is None and len(_servers) >= MAX_SERVERS:
            return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, **kw)
        if server is None or server.proc.poll() is not None:
            server = _servers[key] = Server(env, PRELOAD)
        if server.takes(cmd, env) and server.busy.acquire(blocking=False):
            try:
                if server.is_ready():  # (until it is, commands start processes of their own)
                    return server.run(cmd, env, cwd, **kw)
            finally:
                server.busy.release()
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, **kw)


# ------------------------------------------------------------------ the server
def _logging_as_first_configured(pristine_level, preloaded_handlers):
    """A command that configures logging before it imports fairseq (fairseq_cli's train,
    interactive and preprocess do) sets the root logger of its own process; here fairseq's
    import has configured it already (its handlers, its level). So until the command imports
    fairseq, its ``logging.basicConfig`` takes those away first, as its own process would
    have had none; after, the call is what it is in its own process (a no-op)."""
    import builtins
    import logging

    real_import, real_basic_config = builtins.__import__, logging.basicConfig
    state = {"fairseq": False}

    def tracking_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "fairseq" or name.startswith("fairseq.")):
            state["fairseq"] = True
            builtins.__import__ = real_import
        return real_import(name, globals, locals, fromlist, level)

    def basic_config(**kwargs):
        root = logging.getLogger()
        if not state["fairseq"] and root.handlers == preloaded_handlers:
            for handler in preloaded_handlers:
                root.removeHandler(handler)
            root.setLevel(pristine_level)
        return real_basic_config(**kwargs)

    builtins.__import__ = tracking_import
    logging.basicConfig = basic_config


def _child(req, logging_state):
    """Runs in the forked child: the request's process, ended as an interpreter ends."""
    import runpy

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, name, mode in ((0, "in", os.O_RDONLY), (1, "out", os.O_WRONLY), (2, "err", os.O_WRONLY)):
        f = os.open(req[name], mode | (os.O_CREAT if fd else 0), 0o600)
        os.dup2(f, fd)
        os.close(f)
    _logging_as_first_configured(*logging_state)
    sys.argv = req["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))
    runpy.run_path(req["script"], run_name="__main__")
    raise SystemExit(0)  # (an exception propagates: its traceback on stderr, status 1)


def _serve(requests: int, replies: int, preload):
    import importlib
    import logging

    root = logging.getLogger()
    pristine_level, before = root.level, list(root.handlers)
    for name in preload:
        importlib.import_module(name)
    logging_state = (pristine_level, [h for h in root.handlers if h not in before])
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(replies, (json.dumps({"ready": True}) + "\n").encode())
    with os.fdopen(requests, "rb") as reqs:
        for line in reqs:
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                os.close(replies)
                reqs.close()
                _child(req, logging_state)
            os.write(replies, (json.dumps({"pid": pid}) + "\n").encode())
            _, status = os.waitpid(pid, 0)
            os.write(replies, (json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), [m for m in sys.argv[3].split(",") if m])
