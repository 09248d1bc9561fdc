"""The CPU's instruction-set extensions, read from /proc/cpuinfo without importing torch:
provenance records them, and engines refuse before any job a setting whose kernels this CPU
lacks (vLLM's FP8 KV cache on a CPU needs AVX-512 or AMX)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """Every flag the first processor lists (x86 `flags`, Arm `Features`); empty if unknown."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
