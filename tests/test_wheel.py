"""The package as users install it: ``pip wheel .`` compiles the native engine
for every target of this architecture into the wheel; installed into a fresh
virtual environment, with no C++ compiler on PATH and an empty cache, IAD
through ``fairseq-interactive`` runs on the packaged engine, equals fairseq's
greedy search, and every target this CPU runs (forced with
FAIRSEQ_AGGRESSIVE_ISA) prints the same output.  The sdist carries the
sources."""
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers import ROOT, run

# builds the wheel (five compilations of the engine on x86-64 where build/native/ has none: about
# three minutes on 2 cores) and installs it into a fresh environment: a whole run end to end
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = os.path.join(ROOT, "models", "uagec-9x3")
SENTENCES = 40


def _targets():
    from fairseq_aggressive.native import build, targets

    return targets.shipped(), [t.name for t in build.cpu_targets()]


def _compiler_takes(flags) -> bool:
    """Whether the C++ compiler accepts these target flags."""
    from fairseq_aggressive.native.build import _compiler

    proc = subprocess.run([_compiler(), "-x", "c++", "-c", "-o", os.devnull, *flags, "-"], input="int f() { return 0; }",
                          capture_output=True, text=True)
    return proc.returncode == 0


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv with the wheel installed, its environment, the package dir there)."""
    shipped, _ = _targets()
    if not shipped:
        pytest.skip("no native engine for this architecture")
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ROOT,
         "-w", str(tmp / "dist")])
    wheels = glob.glob(str(tmp / "dist" / "*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    for t in shipped:  # one library per target (an optional one where the compiler has it), no Python module
        if t.optional and not _compiler_takes(t.cflags):
            continue
        assert any(re.fullmatch(rf"fairseq_aggressive/native/_engine_{t.name}\..*so", n) for n in names), (t, names)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheels[0]])
    # the dependencies (torch, fairseq, ...) from this environment, after the venv's own packages
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "_outer_site.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    # no compiler reachable: PATH is the venv's bin only, no CXX, an empty cache and home
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH", "FAIRSEQ_AGGRESSIVE_ISA")}
    env.update(PATH=str(venv / "bin"), HOME=str(tmp / "home"), FAIRSEQ_AGGRESSIVE_CACHE=str(tmp / "cache"),
               PYTHONWARNINGS="ignore")
    probe = subprocess.run([python, "-c", "import shutil, fairseq_aggressive as f; "
                            "print(f.__file__); print([shutil.which(c) for c in ('g++', 'c++', 'clang++', 'gcc')])"],
                           capture_output=True, text=True, env=env, cwd=str(tmp))
    assert probe.returncode == 0, probe.stderr[-3000:]
    pkg_file, compilers = probe.stdout.split("\n")[-3:-1]
    assert pkg_file.startswith(str(venv)), pkg_file  # the installed copy, not the checkout
    assert compilers == "[None, None, None, None]", compilers
    return python, env, os.path.dirname(pkg_file), tmp


def _interactive(installed, *extra, isa=None):
    """fairseq-interactive on the shipped 9+3 UA-GEC model: (hypotheses, stderr)."""
    python, env, pkg, tmp = installed
    src = tmp / "input.txt"
    if not src.exists():
        with open(os.path.join(ROOT, "data", "uagec-sample", "test.tok.src"), encoding="utf-8") as f:
            src.write_text("".join(f.readlines()[:SENTENCES]), encoding="utf-8")
    env = dict(env)
    if isa:
        env["FAIRSEQ_AGGRESSIVE_ISA"] = isa
    proc = subprocess.run(
        [python, "-m", "fairseq_cli.interactive", MODEL, "--path", os.path.join(MODEL, "model.pt"),
         "--user-dir", pkg, "--task", "aggressive_translation", "--source-lang", "src", "--target-lang", "tgt",
         "--beam", "1", "--bpe", "subword_nmt", "--bpe-codes", os.path.join(MODEL, "bpe.codes"),
         "--input", str(src), "--buffer-size", "8", "--batch-size", "8", *extra],
        capture_output=True, text=True, env=env, cwd=str(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyps = [line.split("\t", 2)[2] for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == SENTENCES, proc.stdout[-2000:]
    return hyps, proc.stderr


def test_wheel_decodes_on_the_packaged_engine_without_a_compiler(installed):
    greedy, err = _interactive(installed)  # fairseq's own greedy search (--decoding beam, --beam 1)
    assert "native engine" not in err
    iad, err = _interactive(installed, "--decoding", "iad")
    _, runs = _targets()
    if not runs:
        pytest.skip("this CPU runs none of the wheel's targets")
    used = re.search(r"verifier: the native engine \((\w+),", err)
    assert used and used.group(1) == runs[0], err[-3000:]
    assert "building the native engine" not in err and "torch path" not in err, err[-3000:]
    assert iad == greedy
    python, env, pkg, tmp = installed
    assert not os.path.exists(env["FAIRSEQ_AGGRESSIVE_CACHE"]) or not os.listdir(env["FAIRSEQ_AGGRESSIVE_CACHE"])
    # every target this CPU runs: the same output
    for isa in runs[1:]:
        out, err = _interactive(installed, "--decoding", "iad", isa=isa)
        assert f"verifier: the native engine ({isa}," in err, err[-3000:]
        assert out == iad, isa


def test_wheel_without_its_libraries_warns_and_decodes_on_torch(installed, tmp_path):
    """A copy of the installed package with its libraries and sources removed
    (a broken installation): one warning naming the reason and the torch path,
    no traceback, the same output."""
    python, env, pkg, tmp = installed
    broken = tmp_path / "site"
    shutil.copytree(pkg, broken / "fairseq_aggressive")
    for f in glob.glob(str(broken / "fairseq_aggressive" / "native" / "_engine_*")):
        os.remove(f)
    shutil.rmtree(broken / "fairseq_aggressive" / "native" / "csrc")
    env = dict(env, PYTHONPATH=str(broken))
    hyps, err = _interactive((python, env, str(broken / "fairseq_aggressive"), tmp), "--decoding", "iad")
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "native engine" in line]
    assert len(warnings) == 1 and "no compiled native engine" in warnings[0] and "torch path" in warnings[0], err
    greedy, _ = _interactive(installed)
    assert hyps == greedy


def test_a_kept_library_is_named_by_everything_that_makes_it(tmp_path):
    """setup.py keeps each target's library under build/native/ by a digest of
    its inputs: the same inputs give the same name, any source or header byte,
    flag, compiler version or build-script change another."""
    from fairseq_aggressive.native import targets

    csrc = tmp_path / "csrc"
    shutil.copytree(targets.CSRC, csrc)
    command, version, extra = ["g++", "-O3", "-mavx2"], "g++ (GCC) 12.2.0", b"setup.py text"

    def key():
        return targets.library_key(command, version, extra, str(csrc))

    keys = [key()]
    assert key() == keys[0]
    header = sorted(csrc.glob("*/*.h"))[0]
    header.write_bytes(header.read_bytes() + b" ")
    keys.append(key())
    command = ["g++", "-O2", "-mavx2"]
    keys.append(key())
    version = "g++ (GCC) 13.1.0"
    keys.append(key())
    extra = b"setup.py other text"
    keys.append(key())
    (csrc / "loop" / "new_unit.cpp").write_text("// another unit\n")
    keys.append(key())
    assert len(set(keys)) == len(keys), keys


def test_sdist_has_the_sources(tmp_path):
    from fairseq_aggressive.native import targets

    run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)])
    (sdist,) = glob.glob(str(tmp_path / "*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for p in targets.source_files():
        assert os.path.relpath(p, ROOT) in names, p
    assert "fairseq_aggressive/native/targets.py" in names and "setup.py" in names
    assert "LICENSE" in names  # the code's terms travel with it
