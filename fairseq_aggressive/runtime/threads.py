"""How many threads the native engine uses, and keeping torch's threads out of
its way.

The default (``--native-threads auto``) is the number of CPUs this process may
use: its CPU affinity, within a cgroup CPU quota where one is set (as in
containers).  An integer, or ``FAIRSEQ_AGGRESSIVE_NATIVE_THREADS``, overrides
it.  Model size needs no cap here: the engine shares a call among its threads
only when the call has enough arithmetic (``for_tiles`` and ``for_rows`` in
``native/csrc/cpu/linear.cpp``), so a small model's small calls run on one thread
anyway, and its pool (``native/csrc/pool/parallel.h``) stops offering work to threads
that the machine is not running.  ``docs/threads-and-load.md`` has the
measurements.

While the engine decodes, torch is held to one thread: torch's OpenMP workers
spin for a while after each parallel torch operation, and on the same cores as
the engine's threads they take turns with them instead of working.
"""
import contextlib
import math
import os
from typing import Optional

# the engine's threads for every model in this process (the default's override, like OMP_NUM_THREADS)
THREADS_ENV = "FAIRSEQ_AGGRESSIVE_NATIVE_THREADS"


def _cgroup_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs' worth of this process's cgroup CPU quota (v2 ``cpu.max`` or v1
    ``cpu.cfs_quota_us``), None when there is none."""
    try:
        with open(proc_cgroup) as f:
            lines = [l.strip().split(":", 2) for l in f if l.strip()]
    except OSError:
        return None
    quotas = []
    for parts in lines:
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        path = path.lstrip("/")
        if controllers == "":  # cgroup v2
            for d in {os.path.join(root, path), root}:
                try:
                    with open(os.path.join(d, "cpu.max")) as f:
                        quota, period = f.read().split()[:2]
                except (OSError, ValueError):
                    continue
                if quota != "max" and float(period) > 0:
                    quotas.append(float(quota) / float(period))
        elif "cpu" in controllers.split(","):  # cgroup v1
            for d in {os.path.join(root, controllers, path), os.path.join(root, controllers),
                      os.path.join(root, "cpu", path), os.path.join(root, "cpu")}:
                try:
                    with open(os.path.join(d, "cpu.cfs_quota_us")) as f:
                        quota = float(f.read())
                    with open(os.path.join(d, "cpu.cfs_period_us")) as f:
                        period = float(f.read())
                except (OSError, ValueError):
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
    return min(quotas) if quotas else None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, within its cgroup CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def engine_threads(requested: Optional[int] = None) -> int:
    """The engine's thread count: ``requested`` if given, else
    ``FAIRSEQ_AGGRESSIVE_NATIVE_THREADS`` if set, else :func:`usable_cpus`."""
    if requested is not None:
        return parse_threads(requested)
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            return parse_threads(env)
        except ValueError as e:
            raise ValueError(f"{THREADS_ENV}: {e}") from None
    return usable_cpus()


def parse_threads(value) -> Optional[int]:
    """``--native-threads`` as given: None for ``auto``, else a positive integer (clear error otherwise)."""
    if value in (None, "auto", "", 0, "0"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"--native-threads must be 'auto' or a positive integer, not {value!r}")
    return n


@contextlib.contextmanager
def torch_single_threaded():
    """Hold torch to one intra-op thread inside the block (the engine's threads run meanwhile)."""
    import torch  # (not at the top: parse_threads serves argument parsing, which loads no torch)

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
