"""Build and load the native engine (the C++ sources in ``csrc/``) at first use.

Each ``csrc/*.cpp`` is compiled with the system C++ compiler (the one that
built fairseq's extensions at ``pip install``) for the instruction set this
CPU has, several at once, and linked into one shared library, cached under
``$FAIRSEQ_AGGRESSIVE_CACHE`` (default ``~/.cache/fairseq_aggressive``) and
keyed by every file under ``csrc/``, the flags and the compiler (deleting the
cached ``engine-*.so`` forces a rebuild).  It is a plain shared library
loaded with :mod:`ctypes` (no torch headers); at load its API version
(``fa_version``) and shared structs must be the ones :mod:`.c_api` expects.

Instruction sets: x86-64 with AVX2, FMA and F16C uses 8-lane intrinsics; other
64-bit ARM and x86 CPUs with hardware FMA use the same arithmetic one lane at
a time (bit-identical results); x86 CPUs without FMA get no native engine
(software fma would be slower than torch) and decode on the torch path, with
the same output.
"""
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import List, Optional, Tuple

from . import c_api

logger = logging.getLogger("fairseq_aggressive")

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
# -ffp-contract=off: the compiler fuses no multiply-add on its own (the kernels
# choose every fma), so results do not depend on its choices
COMPILE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-pthread",
                 "-Wall", "-Wextra"]
LINK_FLAGS = ["-shared", "-pthread"]


def _sources() -> List[str]:
    """Every file under csrc/ (sources and headers), sorted: the build key hashes them all."""
    out = []
    for root, dirs, files in os.walk(CSRC):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return out


def _units() -> List[str]:
    """The translation units (csrc/*.cpp), compiled separately and linked together."""
    return [p for p in _sources() if p.endswith(".cpp")]


class NativeUnavailable(RuntimeError):
    """The native engine cannot run here (reason in the message)."""


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isa_flags(generic: bool = False) -> Tuple[str, List[str]]:
    """(name, compiler flags) for this CPU; raises NativeUnavailable."""
    if os.environ.get("FAIRSEQ_AGGRESSIVE_NO_NATIVE"):
        raise NativeUnavailable("FAIRSEQ_AGGRESSIVE_NO_NATIVE is set")
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        flags = _cpu_flags()
        if "fma" not in flags:
            raise NativeUnavailable("this x86 CPU has no FMA instructions")
        if {"avx2", "f16c"} <= flags and not generic:
            return "avx2", ["-mavx2", "-mfma", "-mf16c"]
        return "generic-fma", ["-DFA_GENERIC", "-mfma"]
    if machine in ("aarch64", "arm64"):
        return "generic-fma", ["-DFA_GENERIC"]
    raise NativeUnavailable(f"no native engine for {machine} CPUs")


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise NativeUnavailable("no C++ compiler found (install g++ or set CXX)")
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
    raise NativeUnavailable(f"no writable cache directory for the native engine ({d})")


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
                                + outputs[failed][-2000:])
    return outputs


def _build(cxx: str, flags: List[str], path: str) -> None:
    """Compiles csrc/*.cpp and links them into ``path`` (which appears complete or not at all)."""
    work = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".build-")
    try:
        objects, cmds = [], []
        for src in _units():
            objects.append(os.path.join(work, os.path.basename(src)[: -len(".cpp")] + ".o"))
            cmds.append([cxx, *COMPILE_FLAGS, *flags, "-c", src, "-o", objects[-1]])
        warnings = [w.strip() for w in _run(cmds) if w.strip()]
        tmp = os.path.join(work, "engine.so")
        _run([[cxx, *LINK_FLAGS, *flags, "-o", tmp, *objects]])
        for w in warnings:
            logger.warning(f"native engine build: {w[-2000:]}")
        os.replace(tmp, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_key(cxx: str, flags: List[str]) -> str:
    """A digest of every file under csrc/ (names and contents), the flags and the compiler."""
    h = hashlib.sha256()
    for p in _sources():
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, CSRC).encode() + b"\0" + f.read() + b"\0")
    h.update(" ".join([cxx] + COMPILE_FLAGS + LINK_FLAGS + flags).encode())
    return h.hexdigest()[:16]


def library(generic: bool = False) -> ctypes.CDLL:
    """The compiled engine for this CPU (built once, then cached)."""
    name, flags = isa_flags(generic)
    with _LOCK:
        if generic in _LOADED:
            return _LOADED[generic]
        cxx = _compiler()
        path = os.path.join(_cache_dir(), f"engine-{name}-{build_key(cxx, flags)}.so")
        if not os.path.isfile(path):
            logger.info(f"building the native engine ({name}) with {cxx} ...")
            _build(cxx, flags, path)
        lib = ctypes.CDLL(path)
        problem = c_api.mismatch(lib)
        if problem is not None:
            raise NativeUnavailable(f"the native engine {path} does not match this fairseq_aggressive "
                                    f"({problem}): rebuild it (delete that file; the next use builds it again)")
        _LOADED[generic] = lib
        return lib


def available() -> Optional[str]:
    """None if the native engine can run here, else the reason it cannot."""
    try:
        library()
        return None
    except NativeUnavailable as e:
        return str(e)
