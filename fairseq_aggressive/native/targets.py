"""The native engine's build targets: which instruction sets it is compiled
for, with which flags, and which CPUs run each.

Every target computes the same bits (csrc/cpu/vec.h says how); they differ in
speed only.  ``pip wheel .`` compiles every target of the machine's
architecture into the package (setup.py), and at run time
:mod:`.build` loads the best one this CPU runs.

This module imports nothing from the package: setup.py loads it by path in
an environment without torch or fairseq.
"""
import hashlib
import os
import platform
from typing import Dict, FrozenSet, List, NamedTuple

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")

# -ffp-contract=off: the compiler fuses no multiply-add on its own (the kernels
# choose every fma), so results do not depend on its choices
COMPILE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-pthread",
                 "-fvisibility=hidden", "-g0", "-Wall", "-Wextra"]
# libstdc++ and libgcc linked in: the library needs nothing but the C library
LINK_FLAGS = ["-shared", "-pthread", "-static-libstdc++", "-static-libgcc"]


class Target(NamedTuple):
    name: str
    cpu_flags: FrozenSet[str]  # /proc/cpuinfo flags a CPU needs to run it
    cflags: List[str]
    # a compiler may lack its instructions: a wheel is built without it and
    # the loader goes on to the next target (after one warning)
    optional: bool = False


_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]
_VNNI_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"})
X86_64 = [  # best first
    # int8 products of several rows on AMX tiles (Xeon 4th generation on; GCC 11+, Linux 5.16+): the
    # same bits as avx512vnni, which also runs where the OS does not grant the tiles
    Target("avx512amx", _VNNI_FLAGS | {"amx_tile", "amx_int8"},
           ["-DFA_ISA_AVX512", "-DFA_VNNI", "-DFA_AMX", *_AVX512, "-mavx512vnni", "-mamx-tile", "-mamx-int8"],
           optional=True),
    Target("avx512vnni", _VNNI_FLAGS,
           ["-DFA_ISA_AVX512", "-DFA_VNNI", *_AVX512, "-mavx512vnni"]),
    Target("avx512", frozenset({"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"}),
           ["-DFA_ISA_AVX512", *_AVX512]),
    Target("avx2", frozenset({"avx2", "fma", "f16c"}), ["-DFA_ISA_AVX2", "-mavx2", "-mfma", "-mf16c"]),
    # x86-64 CPUs without FMA get no engine: software fma is slower than torch
    Target("generic", frozenset({"fma"}), ["-mfma"]),
]
# NEON (Advanced SIMD) is part of every AArch64 CPU that runs Linux or macOS: no flag to check.
# With the dot-product extension (sdot: Neoverse N1 and later, Apple silicon; "asimddp" in
# /proc/cpuinfo) the int8 products take 4 k per instruction; without it, int16 pairs.
AARCH64 = [Target("neon-dotprod", frozenset({"asimddp"}), ["-DFA_ISA_NEON", "-DFA_NEON_DOT", "-march=armv8.2-a+dotprod"],
                  optional=True),
           Target("neon", frozenset(), ["-DFA_ISA_NEON"]), Target("generic", frozenset(), [])]

# Built only on demand from a source checkout, for the tests: the portable
# code with the AVX-512 + VNNI layout (16-output panels, int8 in groups of 4),
# so that layout is checked on CPUs without AVX-512; and that code with the
# AMX tile kernels on tiles emulated in software (csrc/cpu/amx.h), so the AMX
# target's tiling is checked on CPUs without AMX
_WIDE = ["-DFA_PANEL=16", "-DFA_Q8_GROUP=4"]
_AMX_EMULATED = [*_WIDE, "-DFA_AMX", "-DFA_AMX_EMULATE"]
EXTRA = {
    "x86_64": [Target("generic-wide", frozenset({"fma"}), ["-mfma", *_WIDE]),
               Target("generic-amx", frozenset({"fma"}), ["-mfma", *_AMX_EMULATED])],
    "aarch64": [Target("generic-wide", frozenset(), _WIDE), Target("generic-amx", frozenset(), _AMX_EMULATED)],
}


def arch(machine: str = "") -> str:
    """``x86_64``, ``aarch64`` or the platform's own name."""
    m = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def shipped(machine: str = "") -> List[Target]:
    """The targets a wheel for this architecture carries, best first ([] where the engine does not run)."""
    return {"x86_64": X86_64, "aarch64": AARCH64}.get(arch(machine), [])


def all_targets(machine: str = "") -> Dict[str, Target]:
    """Every target for this architecture by name, the test-only ones included."""
    return {t.name: t for t in shipped(machine) + EXTRA.get(arch(machine), [])}


def extension_name(target: Target) -> str:
    """The module name of a target's library inside the package."""
    return "_engine_" + target.name.replace("-", "_")


def source_files(csrc: str = CSRC) -> List[str]:
    """Every file under csrc/ (sources and headers), sorted."""
    out = []
    for root, dirs, files in os.walk(csrc):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return out


def units(csrc: str = CSRC) -> List[str]:
    """The translation units (csrc/*/*.cpp but the test library's), compiled
    separately and linked together; each includes the others' headers by their
    path under csrc/ (``-I csrc``)."""
    testing = os.path.join(csrc, "testing")
    return [p for p in source_files(csrc) if p.endswith(".cpp") and os.path.dirname(p) != testing]


def test_units(csrc: str = CSRC) -> List[str]:
    """The test library's extra units (csrc/testing/*.cpp): entry points only tests call."""
    return [p for p in source_files(csrc) if p.endswith(".cpp") and os.path.dirname(p) == os.path.join(csrc, "testing")]


# the test library's define: the engine's test hooks (csrc/pool/parallel.h) and entry points (csrc/testing/)
TEST_DEFINE = "-DFA_TEST_HOOKS"


def source_key(csrc: str = CSRC) -> str:
    """A digest of every file under csrc/ (names and contents): a library built
    from other sources is stale (compiled into it as fa_source_key)."""
    h = hashlib.sha256()
    for p in source_files(csrc):
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, csrc).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def library_key(command: List[str], compiler_version: str, extra: bytes = b"", csrc: str = CSRC) -> str:
    """A digest of what makes a library: every file under csrc/, the whole
    command lines (compiler, its flags from the environment and ours), the
    compiler's version and ``extra`` (the build scripts' own text).  Two builds
    with the same key give the same library."""
    h = hashlib.sha256(source_key(csrc).encode())
    for part in (*command, compiler_version):
        h.update(part.encode() + b"\0")
    h.update(extra)
    return h.hexdigest()[:20]


def defines(csrc: str = CSRC) -> List[str]:
    """The flags that record the sources in the library."""
    return [f'-DFA_SOURCE_KEY="{source_key(csrc)}"']
