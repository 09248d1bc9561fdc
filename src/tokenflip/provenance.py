"""What a result depends on besides its spec: software versions, device, determinism.

Stored in every Parquet file so that two files can be checked for comparability and a
result can be traced to the exact environment that produced it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import torch

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyarrow", "tokenflip")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software() -> dict[str, Any]:
    versions = {name: _version(name) for name in PACKAGES}
    versions["python"] = platform.python_version()
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return versions


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"type": device.type, "threads": torch.get_num_threads(),
                            "machine": platform.machine(), "system": platform.system()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        info["name"] = _cpu_name()
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def determinism() -> dict[str, Any]:
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
    }


def environment(device: torch.device) -> dict[str, Any]:
    return {"software": software(), "device": device_info(device), "determinism": determinism(),
            "argv": sys.argv[:1]}
