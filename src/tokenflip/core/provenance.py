"""What a result depends on besides its spec: software versions, device, determinism.

Stored in every Parquet file so that two files can be checked for comparability and a
result can be traced to the exact environment that produced it; `flatten_provenance` makes
two records comparable field by field. torch is imported where it is read: the Snakefile's
imports reach this module and must not pay for it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

from tokenflip.core.cpu_flags import cpu_model, kernel_flags

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyarrow", "tokenflip")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software() -> dict[str, Any]:
    import torch

    versions = {name: _version(name) for name in PACKAGES}
    versions["python"] = platform.python_version()
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return versions


def device_info(device) -> dict[str, Any]:
    """The device a cell computed on (a torch.device), with what selects its kernels."""
    import torch

    info: dict[str, Any] = {"type": device.type, "threads": torch.get_num_threads(),
                            "machine": platform.machine(), "system": platform.system()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        info["name"] = cpu_model()
        info.update(cpu_kernels())
    return info


def cpu_kernels() -> dict[str, Any]:
    """What selects a CPU's kernels: torch's dispatch capability, the extensions of
    KERNEL_FLAGS the CPU has, and the variables that cap oneDNN and the BLAS."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": kernel_flags(),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            **{name.lower(): os.environ.get(name) for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                                                                "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE")}}


KERNEL_KEYS = ("cpu_capability", "cpu_flags", "mkldnn", "onednn_max_cpu_isa", "dnnl_max_cpu_isa",
               "aten_cpu_capability", "openblas_coretype", "threads", "capability", "name")


def kernel_differences(device_a: dict[str, Any], device_b: dict[str, Any]) -> list[str]:
    """The fields of two recorded devices that select kernels and differ ("cpu_flags:
    avx512_bf16 only in a"), so that a difference between two runs can be traced to them."""
    out = []
    for key in KERNEL_KEYS:
        a, b = device_a.get(key), device_b.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            parts = ([f"{' '.join(only_a)} only in a"] if only_a else []) + (
                [f"{' '.join(only_b)} only in b"] if only_b else [])
            out.append(f"{key}: {'; '.join(parts)}")
        else:
            out.append(f"{key}: {a!r} vs {b!r}")
    return out


def determinism() -> dict[str, Any]:
    import torch

    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
    }


def environment(device) -> dict[str, Any]:
    return {"software": software(), "device": device_info(device), "determinism": determinism(),
            "argv": sys.argv[:1]}


def flatten_provenance(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested provenance as {dotted.key: value}, so that two records compare field by field."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten_provenance(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}
