"""The CPU's model and instruction-set extensions, read from /proc/cpuinfo without importing
torch: provenance records them, a crashed engine's message names them, and engines refuse
before any job a setting whose kernels this CPU lacks (vLLM's FP8 KV cache on a CPU needs
AVX-512 or AMX)."""

from __future__ import annotations

import functools
import platform

# The instruction-set extensions that decide which kernels a CPU runs (oneDNN, torch and
# ggml dispatch on them: AVX2, AVX-512 BF16, AMX): two machines whose model names agree can
# still differ here, and a result recorded under one set is another engine's result.
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "bf16", "fphp")


def _cpuinfo_field(*names: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(names):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """Every flag the first processor lists (x86 `flags`, Arm `Features`); empty if unknown."""
    return frozenset((_cpuinfo_field("flags", "Features") or "").split())


def kernel_flags() -> list[str]:
    """The extensions of KERNEL_FLAGS this CPU has, in the table's order."""
    flags = cpu_flags()
    return [flag for flag in KERNEL_FLAGS if flag in flags]


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The processor's model name ("Intel(R) Xeon(R) Processor"), else what Python knows."""
    return _cpuinfo_field("model name") or platform.processor() or "cpu"
