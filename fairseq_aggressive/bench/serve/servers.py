"""The server processes of the benchmark: their command lines, and starting
one, waiting for its ``serving on`` line and stopping it."""
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

HOST = "127.0.0.1"
READY_TIMEOUT = 120.0  # s for a server to print "serving on"
STOP_TIMEOUT = 60.0  # s for a server to exit after SIGTERM
# the module of the --serve-static and --serve-ct2 modes, run as a file for ct2
SERVE_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve_bench.py")


class ServerProcess:
    """A server subprocess: its output kept, ready once it prints ``serving on``."""

    def __init__(self, name: str, cmd: List[str], env: Optional[Dict] = None):
        self.name, self.cmd = name, cmd
        self.lines: List[str] = []
        self.port: Optional[int] = None
        self._ready = threading.Event()
        self.started = time.perf_counter()
        env = dict(env or os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "serving on http://" in line and not self._ready.is_set():
                self.port = int(line.strip().rsplit(":", 1)[1].strip("/"))
                self._ready.set()
        self._ready.set()  # exited

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        if not self._ready.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError(f"{self.name}: no 'serving on' line within {timeout:.0f} s "
                               f"(exit {self.proc.poll()}):\n" + "\n".join(self.lines[-30:]))
        return time.perf_counter() - self.started

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.lines.append(f"(killed: still running {STOP_TIMEOUT:.0f} s after SIGTERM)")
        self._reader.join(5)
        return self.proc.returncode

    def complaints(self) -> List[str]:
        """Log lines that look wrong (errors, tracebacks, warnings)."""
        keys = ("error", "traceback", "exception", "warning", "killed")
        return [ln for ln in self.lines if any(k in ln.lower() for k in keys)]


def server_command(system: str, args, port: int, ct2_dir=None, ct2_config=None, limits=None) -> List[str]:
    py = sys.executable
    threads = [] if args.native_threads in (None, "auto") else ["--native-threads", str(args.native_threads)]
    common = ["--host", HOST, "--port", str(port), "--max-batch", str(args.max_batch),
              "--workers", str(args.workers)]
    if system in ("iad", "greedy"):
        return ([py, "-m", "fairseq_aggressive.serving.cli", args.model_dir] + common
                + (["--decoding", "greedy"] if system == "greedy" else []) + threads)
    window = ["--window-ms", str(args.window_ms)]
    if system == "static":
        return [py, "-m", "fairseq_aggressive.bench.serve_bench", "--serve-static", args.model_dir] + common \
            + window + threads
    # run as a script: no torch in the CTranslate2 process
    return ([py, SERVE_BENCH, "--serve-ct2", ct2_dir, "--model-dir", args.model_dir] + common + window
            + ["--compute-type", ct2_config["compute_type"], "--threads", str(ct2_config["threads"]),
               "--max-len-a", str(limits["max_len_a"]), "--max-len-b", str(limits["max_len_b"]),
               "--max-positions", str(limits["max_positions"])])
