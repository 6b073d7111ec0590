"""Build and load the native engine (``transformer.cpp``) at first use.

The library is compiled with the system C++ compiler (the one that built
fairseq's extensions at ``pip install``) for the instruction set this CPU has,
and cached under ``$FAIRSEQ_AGGRESSIVE_CACHE`` (default
``~/.cache/fairseq_aggressive``), keyed by the source, the flags and the
compiler.  It is a plain shared library loaded with :mod:`ctypes` (no torch
headers, builds in about 10 seconds).

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

logger = logging.getLogger("fairseq_aggressive")

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformer.cpp")


def _sources() -> List[str]:
    """The engine's source and the headers it includes (all in this directory)."""
    d = os.path.dirname(SOURCE)
    return [SOURCE] + sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".h"))
BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-pthread"]


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


def library(generic: bool = False) -> ctypes.CDLL:
    """The compiled engine for this CPU (built once, then cached)."""
    name, flags = isa_flags(generic)
    with _LOCK:
        if generic in _LOADED:
            return _LOADED[generic]
        cxx = _compiler()
        src = b"".join(open(p, "rb").read() for p in _sources())
        key = hashlib.sha256(src + " ".join([cxx] + BASE_FLAGS + flags).encode()).hexdigest()[:16]
        path = os.path.join(_cache_dir(), f"transformer-{name}-{key}.so")
        if not os.path.isfile(path):
            logger.info(f"building the native engine ({name}) with {cxx} ...")
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
            os.close(fd)
            cmd = [cxx, *BASE_FLAGS, *flags, "-o", tmp, SOURCE]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise NativeUnavailable(f"building the native engine failed:\n{' '.join(cmd)}\n"
                                            + proc.stderr[-2000:])
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        lib = ctypes.CDLL(path)
        _declare(lib)
        _LOADED[generic] = lib
        return lib


def _declare(lib) -> None:
    P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.fa_model_create.restype = P
    lib.fa_model_create.argtypes = [P, P, P, P, P]
    lib.fa_half_linears.restype = I
    lib.fa_half_linears.argtypes = [P]
    lib.fa_int8_linears.restype = I
    lib.fa_int8_linears.argtypes = [P]
    lib.fa_model_free.argtypes = [P]
    lib.fa_set_threads.argtypes = [P, I]
    L64 = ctypes.POINTER(ctypes.c_int64)
    lib.fa_pool_stats.argtypes = [P, L64]
    lib.fa_pool_selftest.restype = ctypes.c_int64
    lib.fa_pool_selftest.argtypes = [I, I, I, I, I, L64]
    lib.fa_begin.restype = P
    lib.fa_begin.argtypes = [P, I, P, P, I]
    lib.fa_state_free.argtypes = [P]
    lib.fa_shortlist_common.restype = I
    lib.fa_shortlist_common.argtypes = [P, I]
    lib.fa_shortlist.restype = I
    lib.fa_shortlist.argtypes = [P, P, I, I, P]
    lib.fa_encoder_out.restype = ctypes.c_int64
    lib.fa_encoder_out.argtypes = [P, P]
    lib.fa_length.restype = I
    lib.fa_length.argtypes = [P, I]
    lib.fa_pass.restype = I
    IP, FP = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
    lib.fa_pass.argtypes = [P, P, I, IP, IP, IP, I, I, F, F, I, F, IP, FP, IP, IP, IP, IP, IP, IP, P]
    lib.fa_simd.restype = I
    lib.fa_set_mask_embed.argtypes = [P, P]
    lib.fa_begin_encoded.restype = P
    lib.fa_begin_encoded.argtypes = [P, I, P, P, I]
    lib.fa_set_feature_proj.argtypes = [P, P, P, I]
    lib.fa_draft.restype = I
    lib.fa_draft.argtypes = [P, P, I, IP, IP, IP, I, I, IP, P]


def available() -> Optional[str]:
    """None if the native engine can run here, else the reason it cannot."""
    try:
        library()
        return None
    except NativeUnavailable as e:
        return str(e)
