"""The engine's aarch64 targets against the x86 ones, bit for bit, under
emulation: scripts/arm/engine_bits.cpp built for this machine's generic target
and, with a cross compiler, for aarch64's neon and generic targets, run (the
aarch64 programs under qemu-user), and their outputs compared line by line.
A build of the neon target with a broken multiply-add (FA_NEON_MUTANT) must
differ: the check can fail.

    python scripts/arm/check_bits.py            # exit 0: every target the same bits
    bash scripts/arm/install_tools.sh           # the cross compiler and qemu-user (Debian packages)

Exit 1 on a difference (the differing lines are printed), 2 when a tool is
missing (its name and how to install it).
"""
import argparse
import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import importlib.util
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# native/targets.py by its path, as setup.py loads it: no torch or fairseq needed here
_spec = importlib.util.spec_from_file_location(
    "fa_targets", os.path.join(HERE, "..", "..", "fairseq_aggressive", "native", "targets.py"))
targets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(targets)
DRIVER = os.path.join(HERE, "engine_bits.cpp")
# the engine's flags (native/targets.py) for a static test program: its test entry points, no -fPIC
FLAGS = [f for f in targets.COMPILE_FLAGS if f not in ("-fPIC", "-fvisibility=hidden")] + [targets.TEST_DEFINE]
CROSS = ("aarch64-linux-gnu-g++",)
QEMU = ("qemu-aarch64", "qemu-aarch64-static")


def which(names):
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def build(cxx, defines, out, jobs):
    """engine_bits.cpp and the engine's sources (its test units too) compiled with ``cxx`` (a command:
    the compiler and its target flags) into ``out``; aarch64 programs linked static (for qemu-user)."""
    cxx = list(cxx)
    cross = any("aarch64" in part for part in cxx)
    srcs = targets.units() + targets.test_units() + [DRIVER]
    with tempfile.TemporaryDirectory() as tmp:
        def compile_one(src):
            obj = os.path.join(tmp, os.path.basename(src) + ".o")
            cmd = [*cxx, *FLAGS, *defines, "-I", targets.CSRC, "-c", src, "-o", obj]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
            return obj

        with ThreadPoolExecutor(jobs) as pool:
            objs = list(pool.map(compile_one, srcs))
        static = ["-static"] if cross else ["-static-libstdc++", "-static-libgcc"]
        proc = subprocess.run([*cxx, "-pthread", *static, *objs, "-o", out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: linking {out}\n{proc.stderr[-3000:]}")


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compilers at once")
    p.add_argument("--keep", default=None, help="keep the programs and their outputs in this directory")
    args = p.parse_args(argv)
    host = which(("g++",))
    cross, qemu = which(CROSS), which(QEMU)
    missing = [name for name, path in (("g++", host), (CROSS[0], cross), (QEMU[0], qemu)) if path is None]
    if missing:
        print(f"missing: {', '.join(missing)} (install: bash scripts/arm/install_tools.sh, or apt-get install "
              "g++-aarch64-linux-gnu qemu-user)", file=sys.stderr)
        return 2
    if targets.arch() != "x86_64":
        print(f"this check runs on x86-64 (here: {targets.arch()})", file=sys.stderr)
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="fa-arm-bits-")
    os.makedirs(work, exist_ok=True)
    # (name, compiler command, defines, how to run it); clang's aarch64 build where clang is installed
    dot = ["-DFA_ISA_NEON", "-DFA_NEON_DOT", "-march=armv8.2-a+dotprod"]
    builds = [("x86-generic", [host], ["-mfma"], []), ("aarch64-neon", [cross], ["-DFA_ISA_NEON"], [qemu]),
              ("aarch64-neon-dotprod", [cross], dot, [qemu]), ("aarch64-generic", [cross], [], [qemu]),
              ("aarch64-neon-mutant", [cross], ["-DFA_ISA_NEON", "-DFA_NEON_MUTANT"], [qemu])]
    clang = which(("clang++",))
    if clang:
        builds.append(("aarch64-neon-clang", [clang, "--target=aarch64-linux-gnu"], ["-DFA_ISA_NEON"], [qemu]))
        builds.append(("aarch64-neon-dotprod-clang", [clang, "--target=aarch64-linux-gnu"], dot, [qemu]))
    else:
        print("(no clang++ here: the neon target is built with g++ only)")
    outputs = {}
    try:
        for name, cxx, defines, runner in builds:
            exe = os.path.join(work, f"bits-{name}")
            build(cxx, defines, exe, max(1, args.jobs))
            rc, out, err = run(runner + [exe])
            outputs[name] = out
            with open(os.path.join(work, f"{name}.txt"), "w") as f:
                f.write(out)
            print(f"{name}: {err} ({len(out.splitlines())} checks, exit {rc})")
            if rc != 0 and not name.endswith("mutant"):
                print(out)
                return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    ref = outputs["x86-generic"]
    bad = 0
    for name in [b[0] for b in builds if b[0] != "x86-generic" and not b[0].endswith("mutant")]:
        if outputs[name] != ref:
            bad += 1
            print(f"{name} differs from x86-generic:")
            sys.stdout.writelines(difflib.unified_diff(ref.splitlines(True), outputs[name].splitlines(True),
                                                       "x86-generic", name, n=0))
        else:
            digest = hashlib.sha256(ref.encode()).hexdigest()[:16]
            print(f"{name}: the same bits as x86-generic ({len(ref.splitlines())} checks, digest {digest})")
    if outputs["aarch64-neon-mutant"] == ref:
        print("the mutant (an unfused multiply-add) gave the same bits: the check cannot see a broken kernel")
        bad += 1
    else:
        n = sum(a != b for a, b in zip(ref.splitlines(), outputs["aarch64-neon-mutant"].splitlines()))
        print(f"aarch64-neon-mutant: differs, as it must ({n} checks)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
