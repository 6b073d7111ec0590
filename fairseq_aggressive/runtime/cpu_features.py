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

from ..constants import PRECISION_CHOICES

logger = logging.getLogger("fairseq_aggressive")

NO_NATIVE_BF16_ENV = "FAIRSEQ_AGGRESSIVE_NO_NATIVE_BF16"


@functools.lru_cache(maxsize=None)
def _hardware_bf16() -> bool:
    import torch  # (in the functions that ask it: describing the machine needs no torch until then)

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
    import torch

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


def cpu_family() -> str:
    """The CPU's family and model numbers as /proc/cpuinfo gives them ("26/2": a Zen 5), or ""."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("cpu family", "model") and key not in fields:
                    fields[key] = line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    except OSError:
        return ""
    return f"{fields['cpu family']}/{fields['model']}" if len(fields) == 2 else ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
_SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


@functools.lru_cache(maxsize=None)
def last_level_cache_bytes(cache_dir: str = CACHE_DIR) -> int:
    """The size of the first CPU's outermost data cache (its highest level, as Linux's
    sysfs lists it: the L3 most CPUs share among cores), or 0 where it is not listed."""
    try:
        entries = sorted(os.listdir(cache_dir))
    except OSError:
        return 0
    best_level, size = 0, 0
    for entry in entries:
        try:
            level, kind, text = (_read(os.path.join(cache_dir, entry, name)) for name in ("level", "type", "size"))
            level = int(level)
        except (OSError, ValueError):
            continue
        scale = _SIZE_SUFFIXES.get(text[-1:].upper())
        digits = text[:-1] if scale else text
        if kind in ("Data", "Unified") and level >= best_level and digits.isdigit():
            best_level, size = level, int(digits) * (scale or 1)
    return size
