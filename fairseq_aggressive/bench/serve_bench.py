"""``fairseq-aggressive-bench-serve``'s module of old (the setup.py entry point,
``python -m fairseq_aggressive.bench.serve_bench ...``): the benchmark lives in
:mod:`fairseq_aggressive.bench.serve`; run with ``--serve-static`` or
``--serve-ct2`` first, this module is the server of that system instead.

The benchmark runs this file as a script for the CTranslate2 server
(``serve_bench.py --serve-ct2 ...``): the subpackage's modules and the serving
modules are then loaded from their files under packages of their own
(:data:`STANDALONE`), so that ``fairseq_aggressive/__init__`` (torch, fairseq)
is not imported."""
import importlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
# run as a script: a package of its own for each of these directories (their __init__ not run)
STANDALONE = {"_fa_bench_serve": os.path.join(HERE, "serve"),
              "_fa_serving": os.path.join(os.path.dirname(HERE), "serving")}


def _module(name: str):
    """The subpackage's module ``NAME``: ``fairseq_aggressive.bench.serve.NAME``,
    or, where this file runs as a script, ``_fa_bench_serve.NAME``."""
    if __package__:
        return importlib.import_module(f"{__package__}.serve.{name}")
    for pkg, directory in STANDALONE.items():
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [directory]
            sys.modules[pkg] = mod
    return importlib.import_module(f"_fa_bench_serve.{name}")


if __package__:  # imported, or run with ``python -m``
    from .serve import cli_main, main

    __all__ = ["cli_main", "main"]

if __name__ == "__main__":
    window = _module("window")
    if sys.argv[1:2] and sys.argv[1] in window.SERVE_MODES:
        sys.exit(window.serve_main(sys.argv[1:]))
    _module("cli").cli_main()
