"""What this CPU does natively, detected once, and the policy for features only
some CPUs have.

The rule: the same command works on every CPU and gives the same result there;
only its speed differs.  A low-precision mode asked for with ``auto`` runs only
where the CPU does it natively (bfloat16: AVX-512 BF16 or AMX, as oneDNN
reports it) and otherwise logs one warning and runs float32.  ``on`` forces it
(bfloat16 is emulated, about 75x slower on an AVX2-only CPU), ``off`` never.

``FAIRSEQ_AGGRESSIVE_NO_NATIVE_BF16=1`` makes this module believe the CPU has
no native bfloat16, so that the fallback is tested on every machine.
"""
import functools
import logging
import os
import platform

import torch

from ..constants import PRECISION_CHOICES

logger = logging.getLogger("fairseq_aggressive")

NO_NATIVE_BF16_ENV = "FAIRSEQ_AGGRESSIVE_NO_NATIVE_BF16"


@functools.lru_cache(maxsize=None)
def _hardware_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def native_bf16() -> bool:
    """True where bfloat16 matrix math is native (not emulated) on this CPU."""
    if os.environ.get(NO_NATIVE_BF16_ENV, "").strip() not in ("", "0"):
        return False
    return _hardware_bf16()


def cpu_capability() -> str:
    """torch's dispatch level for this CPU: ``DEFAULT``, ``AVX2``, ``AVX512`` ..."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


_warned = set()


def use_bf16(mode, what: str) -> bool:
    """Whether ``what`` (e.g. "--cpu-bf16") runs in bfloat16 under ``mode``.

    ``mode``: ``auto`` / ``on`` / ``off`` (``True`` means ``auto``, ``False`` or
    ``None`` mean ``off``, for callers that pass a flag)."""
    if mode is True:
        mode = "auto"
    if mode in (False, None):
        mode = "off"
    mode = str(mode)
    if mode not in PRECISION_CHOICES:
        raise ValueError(f"{what}: expected one of {', '.join(PRECISION_CHOICES)}, got {mode!r}")
    if mode == "off":
        return False
    native = native_bf16()
    if mode == "on":
        if not native:
            _warn_once((what, mode), f"{what} on: this CPU ({cpu_capability()}) has no native bfloat16; "
                             "bfloat16 runs emulated and much slower than float32")
        return True
    if not native:
        why = ("disabled by " + NO_NATIVE_BF16_ENV) if _hardware_bf16() else f"capability {cpu_capability()}"
        _warn_once((what, mode), f"{what}: this CPU has no native bfloat16 ({why}); running float32 "
                         f"instead (pass '{what} on' to force bfloat16)")
    return native


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict:
    """The facts a speed number depends on, for benchmark output."""
    try:
        import fairseq

        fairseq_version = getattr(fairseq, "__version__", "unknown")
    except ImportError:
        fairseq_version = "not installed"
    return {
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
        "native_bf16": native_bf16(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fairseq": fairseq_version,
        "python": platform.python_version(),
        "native_engine": native_engine_target(),
    }


def native_engine_target() -> str:
    """The native engine's build target that loads here (``avx2``, ``avx512vnni``
    ...; ``FAIRSEQ_AGGRESSIVE_ISA`` respected), or why none does."""
    from ..native.build import NativeUnavailable, library

    try:
        return library().fa_isa().decode()
    except NativeUnavailable as e:
        return f"none ({e})"


def describe_machine(info=None) -> str:
    info = info or machine_info()
    return (f"{info['cpu_model']} | capability {info['cpu_capability']} | native bf16: "
            f"{'yes' if info['native_bf16'] else 'no'} | {info['cores']} cores, "
            f"{info['torch_threads']} torch threads | torch {info['torch']}, fairseq {info['fairseq']}"
            + (f" | native engine {info['native_engine']}" if "native_engine" in info else ""))
