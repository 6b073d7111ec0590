"""A defined CPU load beside a benchmark: ``n`` processes that each keep one
core busy (a pure-Python loop, as a training job or another service's worker
would), started before the first timed decode and stopped after the last, so
that every system in the run decodes under the same load.

Each process also stops by itself when the process that started it is gone
(checked about every 50 ms), so a benchmark that is killed leaves no load behind.
"""
import contextlib
import logging
import os
import subprocess
import sys
import time
from typing import Iterator, List

logger = logging.getLogger("fairseq_aggressive")

_BUSY = (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(200000):\n"
    "        pass\n"
)


def start(n: int) -> List[subprocess.Popen]:
    """Start ``n`` CPU-bound processes (0: none)."""
    if n < 0:
        raise ValueError(f"--bench-load must be >= 0, got {n}")
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    if procs:
        time.sleep(0.2)  # running before the first timed decode
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            stop(procs)
            raise RuntimeError("a load process exited at start")
        logger.info(f"load: {n} CPU-bound processes beside the benchmark (pids "
                    f"{', '.join(str(p.pid) for p in procs)}) on {os.cpu_count()} CPUs")
    return procs


def stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


@contextlib.contextmanager
def cpu_load(n: int) -> Iterator[List[subprocess.Popen]]:
    """``n`` CPU-bound processes for the duration of the block."""
    procs = start(n)
    try:
        yield procs
    finally:
        stop(procs)
