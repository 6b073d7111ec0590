"""Find, load and, in a source checkout, build the native engine.

An installed package carries one compiled library per instruction-set target
of its architecture (:mod:`.targets`; setup.py builds them into the wheel):
``_engine_avx512vnni``, ``_engine_avx512``, ``_engine_avx2``, ``_engine_generic``
on x86-64, ``_engine_generic`` on aarch64.  :func:`library` loads the best one
this CPU runs; ``FAIRSEQ_AGGRESSIVE_ISA=<target>`` forces one (every target
gives the same results, only the speed differs).

Where the package has no library for the target (a source checkout that was
never built, or one whose ``csrc/`` changed since), the engine is compiled at
first use with the system C++ compiler into ``$FAIRSEQ_AGGRESSIVE_CACHE``
(default ``~/.cache/fairseq_aggressive``), keyed by the sources, flags and
compiler (processes that want one at once take turns: one builds it).  It is
a plain C shared library loaded with :mod:`ctypes` (no torch
headers); at load its API version (``fa_version``) and shared structs must be
the ones :mod:`.c_api` expects.

Anything that keeps the engine from loading raises :class:`NativeUnavailable`
with the reason; ``--engine auto`` then decodes on the torch path (same output,
slower) after one warning.
"""
import contextlib
import ctypes
import glob
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import Callable, List, Optional

try:
    import fcntl
except ImportError:  # (no POSIX file locks: each process builds for itself)
    fcntl = None

from . import c_api, targets
from .targets import Target

logger = logging.getLogger("fairseq_aggressive")

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CSRC = targets.CSRC
ISA_ENV = "FAIRSEQ_AGGRESSIVE_ISA"
NO_NATIVE_ENV = "FAIRSEQ_AGGRESSIVE_NO_NATIVE"


class NativeUnavailable(RuntimeError):
    """The native engine cannot run here (reason in the message).  ``setup``:
    the engine itself is missing or cannot load (as opposed to a model or
    option it does not run)."""

    def __init__(self, message: str, setup: bool = False):
        super().__init__(message)
        self.setup = setup


def _cpu_flags() -> set:
    """The CPU's feature flags as /proc/cpuinfo names them (x86 "flags", aarch64 "Features"); on
    macOS the aarch64 dot-product extension from sysctl, named as Linux names it ("asimddp")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if platform.system() == "Darwin" and targets.arch() == "aarch64":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return {"asimddp"} if out == "1" else set()
    return set()


def cpu_targets() -> List[Target]:
    """The shipped targets this CPU runs, best first (may be empty)."""
    flags = _cpu_flags()
    return [t for t in targets.shipped() if t.cpu_flags <= flags]


def runnable_targets() -> List[str]:
    """Every target this CPU runs, the test-only ones included (names)."""
    flags = _cpu_flags()
    return [n for n, t in targets.all_targets().items() if t.cpu_flags <= flags]


def choose_target(isa: Optional[str] = None) -> Target:
    """The target to load: ``isa`` (a target name, or None / ``auto`` for
    ``$FAIRSEQ_AGGRESSIVE_ISA`` or else the best this CPU runs).  Raises
    NativeUnavailable."""
    if os.environ.get(NO_NATIVE_ENV, "").strip() not in ("", "0"):
        raise NativeUnavailable(f"{NO_NATIVE_ENV} is set")
    every = targets.all_targets()
    if not every:
        raise NativeUnavailable(f"no native engine for {targets.arch()} CPUs", setup=True)
    source = "the argument"
    if isa in (None, "", "auto"):
        isa, source = os.environ.get(ISA_ENV, "").strip() or "auto", ISA_ENV
    if isa == "auto":
        runs = cpu_targets()
        if not runs:
            raise NativeUnavailable("this x86 CPU has no FMA instructions (the engine needs them)", setup=True)
        return runs[0]
    if isa not in every:
        raise NativeUnavailable(f"{source}: unknown target {isa!r} (choose from auto, {', '.join(every)})",
                                setup=True)
    target = every[isa]
    missing = sorted(target.cpu_flags - _cpu_flags())
    if missing:
        raise NativeUnavailable(f"{source}: target {isa} needs CPU features this CPU lacks "
                                f"({', '.join(missing)})", setup=True)
    return target


def packaged(target: Target) -> Optional[str]:
    """The library the package carries for ``target``, or None."""
    found = sorted(glob.glob(os.path.join(PACKAGE_DIR, targets.extension_name(target) + ".*so")))
    return found[0] if found else None


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise NativeUnavailable("no C++ compiler found (install g++ or set CXX)", setup=True)
    return cxx


def _cache_dir() -> str:
    """The cache directory; a temporary one if the home directory is not writable."""
    d = os.environ.get("FAIRSEQ_AGGRESSIVE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fairseq_aggressive")
    for cand in (d, os.path.join(tempfile.gettempdir(), f"fairseq_aggressive-{os.getuid()}")):
        try:
            os.makedirs(cand, exist_ok=True)
            if os.access(cand, os.W_OK):
                return cand
        except OSError:
            pass
    raise NativeUnavailable(f"no writable cache directory for the native engine ({d})", setup=True)


_LOCK = threading.Lock()
_LOADED = {}


def _run(cmds: List[List[str]]) -> List[str]:
    """Runs the commands, as many at once as there are CPUs; returns their
    output (warnings).  Raises NativeUnavailable with the first failure's."""
    outputs, failed = [""] * len(cmds), None
    todo, running = list(range(len(cmds))), []
    limit = max(1, os.cpu_count() or 1)
    try:
        while todo or running:
            while todo and len(running) < limit and failed is None:
                i = todo.pop(0)
                try:
                    running.append((i, subprocess.Popen(cmds[i], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                        text=True)))
                except OSError as e:
                    outputs[i], failed = str(e), i
            if not running:
                break
            i, proc = running.pop(0)
            outputs[i] = proc.communicate()[0] or ""
            if proc.returncode != 0 and failed is None:
                failed = i
    finally:
        for _, proc in running:
            proc.kill()
            proc.wait()
    if failed is not None:
        raise NativeUnavailable(f"building the native engine failed:\n{' '.join(cmds[failed])}\n"
                                + outputs[failed][-2000:], setup=True)
    return outputs


def _build(cxx: str, flags: List[str], path: str, units: Optional[List[str]] = None) -> None:
    """Compiles ``units`` (default csrc/*.cpp) and links them into ``path``
    (which appears complete or not at all)."""
    work = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".build-")
    try:
        objects, cmds = [], []
        for i, src in enumerate(units or targets.units()):
            objects.append(os.path.join(work, f"{i}-{os.path.basename(src)[: -len('.cpp')]}.o"))
            cmds.append([cxx, *targets.COMPILE_FLAGS, *flags, "-I", CSRC, "-c", src, "-o", objects[-1]])
        warnings = [w.strip() for w in _run(cmds) if w.strip()]
        tmp = os.path.join(work, "engine.so")
        _run([[cxx, *targets.LINK_FLAGS, *flags, "-o", tmp, *objects]])
        for w in warnings:
            logger.warning(f"native engine build: {w[-2000:]}")
        os.replace(tmp, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _dir_lock(directory: str):
    """Held by one process at a time: an advisory lock on the directory itself
    (no lock file: a failed build leaves the directory as it was)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _build_once(path: str, what: str, build: Callable[[], None], lock=_dir_lock) -> None:
    """``path`` built by ``build()`` unless it exists.  Processes that want a
    library of the cache at once (test workers, a server's processes on a fresh
    install) take turns on the cache's ``lock``: one builds, the others then
    find it built."""
    if os.path.isfile(path):
        return
    with lock(os.path.dirname(path)):
        if not os.path.isfile(path):
            logger.info(f"building the native engine{what} ...")
            build()


def build_key(cxx: str, flags: List[str]) -> str:
    """A digest of every file under csrc/, the flags and the compiler."""
    h = hashlib.sha256(targets.source_key().encode())
    h.update(" ".join([cxx] + targets.COMPILE_FLAGS + targets.LINK_FLAGS + flags).encode())
    return h.hexdigest()[:16]


def program(name: str, sources: List[str], flags: List[str]) -> str:
    """A diagnostic or stress program (scripts/diagnostics/) compiled from ``sources`` with csrc/'s
    headers and ``flags`` into the cache once, keyed by csrc/, the sources, the flags and the
    compiler; its path.  Raises NativeUnavailable with the compiler's output if it fails."""
    cxx = _compiler()
    h = hashlib.sha256(targets.source_key().encode())
    for src in sources:
        with open(src, "rb") as f:
            h.update(os.path.basename(src).encode() + b"\0" + f.read() + b"\0")
    h.update(" ".join([cxx, *flags]).encode())
    path = os.path.join(_cache_dir(), f"{name}-{h.hexdigest()[:16]}")

    def build():
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            for w in _run([[cxx, *flags, "-I", CSRC, *sources, "-o", tmp]]):
                if w.strip():
                    logger.warning(f"{name} build: {w.strip()[-2000:]}")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    _build_once(path, f"'s program {name} with {cxx}", build)
    return path


def compile_target(target: Target) -> str:
    """The library of ``target`` compiled from csrc/ into the cache (built once); its path."""
    if not os.path.isdir(CSRC):
        raise NativeUnavailable(f"this installation has no compiled native engine for {target.name} and no "
                                f"sources to build one (reinstall fairseq-aggressive from a wheel or the sdist)",
                                setup=True)
    cxx = _compiler()
    flags = target.cflags + targets.defines()
    path = os.path.join(_cache_dir(), f"engine-{target.name}-{build_key(cxx, flags)}.so")
    _build_once(path, f" ({target.name}) with {cxx}", lambda: _build(cxx, flags, path))
    return path


def test_library(isa: Optional[str] = None) -> ctypes.CDLL:
    """The engine built with its test hooks and test-only entry points
    (csrc/testing/: ``fa_pool_selftest``, ``fa_pool_lose_next_count``,
    ``fa_set_eager_projection_bytes``): for the tests, never loaded by
    decoding.  Compiled into the cache once."""
    target = choose_target(isa)
    if not os.path.isdir(CSRC):
        raise NativeUnavailable("the test library is built from csrc/, which this installation lacks", setup=True)
    cxx = _compiler()
    flags = target.cflags + targets.defines() + [targets.TEST_DEFINE]
    path = os.path.join(_cache_dir(), f"engine-test-{target.name}-{build_key(cxx, flags)}.so")
    with _LOCK:
        if path in _LOADED:
            return _LOADED[path]
        _build_once(path, f"'s test library ({target.name}) with {cxx}",
                    lambda: _build(cxx, flags, path, targets.units() + targets.test_units()))
        lib = _load(path)
        c_api.declare_testing(lib)
        _LOADED[path] = lib
        return lib


def _load(path: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise NativeUnavailable(f"cannot load the native engine {path}: {e}", setup=True) from e
    problem = c_api.mismatch(lib)
    if problem is not None:
        raise NativeUnavailable(f"the native engine {path} does not match this fairseq_aggressive ({problem}): "
                                f"reinstall the package (or, in a source checkout, delete that file)", setup=True)
    return lib


def _built_from(path: str) -> Optional[str]:
    """The source key a library file records (read before its API is checked:
    a library of older sources is rebuilt, not refused); None if unreadable."""
    try:
        fn = ctypes.CDLL(path).fa_source_key
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    return fn().decode()


def _locate(target: Target) -> str:
    """The library file for ``target``: the package's own unless its sources
    changed since it was built (a checkout being edited), else a compiled one."""
    path = packaged(target)
    if path is None:
        return compile_target(target)
    if os.path.isdir(CSRC):
        if _built_from(path) not in ("", targets.source_key()):
            try:
                return compile_target(target)
            except NativeUnavailable as e:
                logger.warning(f"the native engine {path} was built from other sources than csrc/ and cannot be "
                               f"rebuilt ({e}); using it as it is")
    return path


def _load_target(target: Target) -> ctypes.CDLL:
    try:
        return _load(_locate(target))
    except NativeUnavailable:
        raise
    except Exception as e:  # anything else the file system or loader raises
        raise NativeUnavailable(f"the native engine ({target.name}) cannot load: {type(e).__name__}: {e}",
                                setup=True) from e


def library(isa: Optional[str] = None) -> ctypes.CDLL:
    """The native engine for ``isa`` (see :func:`choose_target`), loaded once per
    process.  Where the best target this CPU runs is an optional one (AMX) that
    this installation lacks and cannot build, the next one loads, after one
    warning."""
    target = choose_target(isa)
    automatic = isa in (None, "", "auto") and not os.environ.get(ISA_ENV, "").strip()
    key = "auto" if automatic else target.name
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        runs = cpu_targets() if automatic and target.optional else [target]
        skipped = []  # optional targets that did not load: one warning once another has
        for candidate in runs[runs.index(target):]:
            lib = _LOADED.get(candidate.name)
            if lib is not None:
                break
            try:
                lib = _load_target(candidate)
            except NativeUnavailable as e:
                if not candidate.optional or candidate is runs[-1]:
                    raise  # nothing loads: the caller's one warning says why
                skipped.append(f"the native engine's {candidate.name} target is not available here ({e})")
                continue
            for line in skipped:
                logger.warning(f"{line}; {candidate.name}, the next one this CPU runs, loads (the same results)")
            state = lib.fa_amx_state()
            if state < 0:
                logger.warning(f"the native engine {lib.fa_isa().decode()}: AMX tiles "
                               f"{'are refused to this process by the OS' if state == -2 else 'are off in this CPU or OS'}"
                               f"; its int8 products run on VNNI tiles (the same results)")
            break
        _LOADED[key] = _LOADED[candidate.name] = lib
        return lib


def available(isa: Optional[str] = None) -> Optional[str]:
    """None if the native engine can run here, else the reason it cannot."""
    try:
        library(isa)
        return None
    except NativeUnavailable as e:
        return str(e)
