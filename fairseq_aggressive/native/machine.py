"""The machine a speed number was measured on: its CPU, torch's and fairseq's
versions and the native engine's build target that loads here, as every
benchmark and diagnostic prints them."""
import os
import platform

from ..runtime.cpu_features import cpu_capability, cpu_family, cpu_model, native_bf16
from .build import NativeUnavailable, library


def machine_info() -> dict:
    """The facts a speed number depends on, for benchmark output."""
    import torch  # (here: a script that only describes the machine or refuses its arguments starts without it)

    try:
        import fairseq

        fairseq_version = getattr(fairseq, "__version__", "unknown")
    except ImportError:
        fairseq_version = "not installed"
    return {
        "cpu_model": cpu_model(),
        "cpu_family": cpu_family(),
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
    try:
        lib = library()
    except NativeUnavailable as e:
        return f"none ({e})"
    isa, amx = lib.fa_isa().decode(), lib.fa_amx_state()
    if amx == 0:
        return isa
    return f"{isa} ({'AMX tiles' if amx == 1 else 'AMX tiles off: VNNI tiles'})"


def describe_machine(info=None) -> str:
    info = info or machine_info()
    family = f" (family/model {info['cpu_family']})" if info.get("cpu_family") else ""
    return (f"{info['cpu_model']}{family} | capability {info['cpu_capability']} | native bf16: "
            f"{'yes' if info['native_bf16'] else 'no'} | {info['cores']} cores, "
            f"{info['torch_threads']} torch threads | torch {info['torch']}, fairseq {info['fairseq']}"
            + (f" | native engine {info['native_engine']}" if "native_engine" in info else ""))
