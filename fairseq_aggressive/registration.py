"""The package's components registered with fairseq (its task, models,
criterions, ``--bpe hf_sentencepiece``) and the loading shims applied
(:mod:`.compat`, :mod:`.distributed`) once fairseq is loaded, whichever of the
two is imported first.

Importing ``fairseq_aggressive`` calls :func:`register_with_fairseq`: at once
where fairseq is already loaded (``--user-dir fairseq_aggressive``, or a script
that imported fairseq first), else as soon as fairseq has loaded.  So the tools
that need no model (the scorers of :mod:`.evaluation`, data preparation) start
without loading torch and fairseq, and ``import fairseq_aggressive`` before or
after fairseq's own imports registers the same components.

"As soon as fairseq has loaded" is not always at once: a module of this package
that imports fairseq is itself half-run at that moment, and the registration
imports the package's modules, that one among them.  So a finder placed first
on ``sys.meta_path`` (until the registration is done) watches the loading of
fairseq and of this package's modules: each thread counts the package's modules
it is running; fairseq's load registers at once where that count is 0, else the
registration waits until the outermost of them has run.
"""
import sys
import threading

_lock = threading.RLock()
_local = threading.local()  # .depth: this package's modules being run on this thread
_registered = False
_registering = False
_pending = False  # fairseq loaded while one of the package's modules was running


def register() -> None:
    """Register every component with fairseq and apply the shims (once; imports fairseq)."""
    global _registered, _registering, _pending
    with _lock:
        if _registered or _registering:
            return
        _registering, _pending = True, False
        try:
            from .compat import patch_checkpoint_loading
            from .distributed import patch_cpu_distributed

            patch_checkpoint_loading()
            patch_cpu_distributed()  # fairseq's distributed training on CPU processes (GPU runs untouched)
            from . import criterions, models, tasks  # noqa: F401  (register components)
            from .hf import bpe  # noqa: F401  (--bpe hf_sentencepiece)
            _registered = True
        finally:
            _registering = False
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Watch)]


def register_with_fairseq() -> None:
    """:func:`register` now if fairseq is loaded, else as soon as it has loaded."""
    if "fairseq" in sys.modules:
        register()
        return
    with _lock:
        if not _registered and not any(isinstance(f, _Watch) for f in sys.meta_path):
            sys.meta_path.insert(0, _Watch())


def _ours(name: str) -> bool:
    return name.startswith(__package__ + ".")


class _Watch:
    """Finds fairseq and this package's modules through the other finders and
    wraps their loaders in :class:`_Run`."""

    def find_spec(self, name, path, target=None):
        if _registered or (name != "fairseq" and not _ours(name)):
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Run(spec.loader, _ours(name))
        return spec

    def invalidate_caches(self):
        pass


class _Run:
    """A module's own loader; after it: fairseq's load registers (or marks the
    registration pending), the outermost of this package's modules registers if pending."""

    def __init__(self, loader, ours: bool):
        self.loader, self.ours = loader, ours

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        global _pending
        depth = getattr(_local, "depth", 0)
        if self.ours:
            _local.depth = depth + 1
        try:
            self.loader.exec_module(module)
        finally:
            _local.depth = depth
        if not self.ours and depth > 0:
            _pending = True
        elif (not self.ours or _pending) and depth == 0:
            register()

    def __getattr__(self, name):  # get_source, get_resource_reader, is_package ... as the module's own loader
        if name in ("loader", "ours"):
            raise AttributeError(name)
        return getattr(self.loader, name)

