"""fairseq-aggressive: the Python package and its native engine.

Building a wheel (``pip wheel .``, ``python -m build``, ``pip install .``)
compiles the native engine, a plain C shared library (no Python or torch
headers), once per instruction-set target of the machine's architecture
(fairseq_aggressive/native/targets.py: AMX, AVX-512 + VNNI, AVX-512, AVX2
and generic on x86-64; neon-dotprod, neon and generic on aarch64; AMX only where the compiler has
its instructions); at run time the package loads the
best one the CPU runs.  It needs a C++17 compiler (g++ or clang++).
``FAIRSEQ_AGGRESSIVE_BUILD_NATIVE=0`` builds the package without them (it then
compiles the engine at first use where a compiler exists, else decodes on the
torch path).
"""
import functools
import importlib.util
import os
import shutil
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("fairseq_aggressive", "native", "csrc")


def _targets():
    """fairseq_aggressive/native/targets.py, loaded by path (the package imports torch)."""
    spec = importlib.util.spec_from_file_location(
        "_fairseq_aggressive_targets", os.path.join(HERE, "fairseq_aggressive", "native", "targets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TARGETS = _targets()


class NativeLibrary(Extension):
    """The native engine for one target: a shared library loaded with ctypes, not a Python module."""

    def __init__(self, target):
        super().__init__("fairseq_aggressive.native." + TARGETS.extension_name(target),
                         sources=[os.path.relpath(p, HERE) for p in TARGETS.units(os.path.join(HERE, CSRC))],
                         language="c++")
        self.target = target


class BuildNative(build_ext):
    """build_ext with each target's flags and its own object directory, the
    targets compiled in parallel, each library kept in build/native/ under a
    digest of its inputs (an editable install and a wheel built after it
    compile once), and a clear error where there is no compiler."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def get_export_symbols(self, ext):
        return [] if isinstance(ext, NativeLibrary) else super().get_export_symbols(ext)

    def build_extension(self, ext):
        if not isinstance(ext, NativeLibrary):
            return super().build_extension(ext)
        # (build_ext runs extensions in parallel threads: nothing here changes self)
        path = self.get_ext_fullpath(ext.name)
        csrc = os.path.join(HERE, CSRC)
        inputs = TARGETS.source_files(csrc) + [TARGETS.__file__, os.path.join(HERE, "setup.py")]
        if not self.force and os.path.exists(path) and all(os.path.getmtime(p) <= os.path.getmtime(path)
                                                           for p in inputs):
            return
        cflags = TARGETS.COMPILE_FLAGS + ext.target.cflags + TARGETS.defines(csrc)
        cached = self.cached_library(ext, cflags)
        if cached and not self.force and os.path.isfile(cached):  # built before from the same inputs
            self.mkpath(os.path.dirname(path))
            shutil.copy(cached, path)  # (a new mtime: up to date for the check above)
            return
        try:
            objects = self.compiler.compile(ext.sources, output_dir=os.path.join(self.build_temp, ext.target.name),
                                            include_dirs=[CSRC], extra_postargs=cflags)
            self.compiler.link_shared_object(
                objects, path, extra_postargs=[f for f in TARGETS.LINK_FLAGS if f != "-shared"] + ext.target.cflags,
                target_lang="c++")
        except Exception as e:  # CompileError, LinkError, a compiler that is not there
            if ext.target.optional:  # a compiler without its instructions: the package loads the next target
                self.warn(f"the native engine's optional {ext.target.name} target was not built ({e}); "
                          "CPUs with it run the next target (the same results)")
                return
            raise SystemExit(
                f"error: compiling fairseq-aggressive's native engine ({ext.target.name}) failed: {e}\n"
                "It needs a C++17 compiler (g++ or clang++; e.g. apt-get install g++). To install without it "
                "(decoding then runs on the torch path, several times slower), set "
                "FAIRSEQ_AGGRESSIVE_BUILD_NATIVE=0.") from e
        if cached:  # kept in place of the target's library of other inputs
            try:
                folder = os.path.dirname(cached)
                os.makedirs(folder, exist_ok=True)
                for old in os.listdir(folder):
                    if old.startswith(ext.target.name + "-") and old.endswith(".so"):
                        os.remove(os.path.join(folder, old))
                tmp = f"{cached}.{os.getpid()}.tmp"
                shutil.copy2(path, tmp)
                os.replace(tmp, cached)
            except OSError:  # a source tree we cannot write: nothing kept, nothing lost
                pass

    def cached_library(self, ext, cflags):
        """Where this source tree keeps the library of ``ext`` built with these
        sources, flags and compiler (build/native/), so that an editable install
        and a wheel built after it compile each target once; None where the
        compiler cannot tell its version."""
        command = (list(self.compiler.compiler_so) + cflags + ["--link"] + list(self.compiler.linker_so)
                   + TARGETS.LINK_FLAGS + ext.target.cflags)
        version = _compiler_version(self.compiler.compiler_so[0])
        if version is None:
            return None
        extra = b"".join(_read(p) for p in (TARGETS.__file__, os.path.join(HERE, "setup.py")))
        key = TARGETS.library_key(command, version, extra, os.path.join(HERE, CSRC))
        return os.path.join(HERE, "build", "native", f"{ext.target.name}-{key}.so")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler):
    try:
        proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def native_libraries():
    if os.environ.get("FAIRSEQ_AGGRESSIVE_BUILD_NATIVE", "1").strip() in ("0", "no", "false"):
        return []
    return [NativeLibrary(t) for t in TARGETS.shipped()]


setup(
    name="fairseq-aggressive",
    version="0.1.0",
    description="Aggressive (draft -> verify -> accept) decoding for fairseq: "
    "greedy-identical output, several times faster",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="MIT",
    classifiers=["Programming Language :: Python :: 3",
                 "Programming Language :: C++", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
    packages=find_packages(include=["fairseq_aggressive", "fairseq_aggressive.*"]),
    # the native engine: one library per target (built here), and its sources
    ext_modules=native_libraries(),
    cmdclass={"build_ext": BuildNative},
    package_data={"fairseq_aggressive.native": ["csrc/*/*.h", "csrc/*/*.cpp"]},
    python_requires=">=3.8",
    install_requires=[
        # fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed ships the
        # same `fairseq` module for 3.11+
        "fairseq==0.12.2; python_version < '3.11'",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "numpy<2",
        "pyyaml",  # configs/ (scripts/experiments/pipeline.py); fairseq pulls it in too
        "sacrebleu>=2.0",
        "sacremoses",
        "subword-nmt",
        "tqdm",
    ],
    extras_require={
        "data": ["ua-gec"],
        "bench": ["matplotlib"],
        # pytest-timeout: a per-test time limit (pytest.ini) that fails a hung test with every thread's stack
        # pytest-xdist: make test runs a worker per CPU; filelock: those workers train the shared test models once
        # httpx, starlette, uvicorn, prometheus_client: tests/test_serving_app.py
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "filelock",
                 "httpx", "starlette", "uvicorn", "prometheus_client"],
        # the HTTP service (fairseq_aggressive/serving): httpx for Starlette's test client
        # httptools and uvloop: uvicorn's C HTTP parser and event loop (the server falls back to h11 and
        # asyncio's loop without them, slower)
        "serve": ["starlette>=0.37", "uvicorn>=0.29", "prometheus_client>=0.20", "httpx", "httptools>=0.6",
                  "uvloop>=0.19; sys_platform != 'win32'"],
        # Hugging Face checkpoints imported (fairseq-aggressive-import-hf, docs/hugging-face.md)
        "hf": ["transformers>=4.40", "sentencepiece>=0.1.99", "safetensors", "protobuf"],
        # CTranslate2 as a benchmark baseline (bench modes ct2, ct2-int8)
        "ct2": ["ctranslate2>=4.0"],
        # ERRANT (BEA-19 evaluation); pulls in spaCy. The English model must be
        # installed separately: python -m spacy download en_core_web_sm
        "gec": ["errant"],
    },
    entry_points={
        "console_scripts": [
            "fairseq-aggressive-bench = fairseq_aggressive.bench:cli_main",
            "fairseq-aggressive-serve = fairseq_aggressive.serving.cli:cli_main",
            "fairseq-aggressive-translate = fairseq_aggressive.serving.translate_cli:cli_main",
            "fairseq-aggressive-bench-serve = fairseq_aggressive.bench.serve_bench:cli_main",
            "fairseq-aggressive-m2 = fairseq_aggressive.evaluation.m2:main",
            "fairseq-aggressive-gleu = fairseq_aggressive.evaluation.gleu:main",
            "fairseq-aggressive-bleu = fairseq_aggressive.evaluation.bleu:main",
            "fairseq-aggressive-import-hf = fairseq_aggressive.hf.cli:cli_main",
        ]
    },
)
