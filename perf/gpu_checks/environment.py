"""The versions of what ran: machine, GPU, driver, CUDA, torch, transformers, the pins."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from .record import REPO


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def locked_versions(names: list[str]) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return {n: pins.get(re.sub(r"[-_.]+", "-", n).lower()) for n in names}


def code_digest(repo: Path = REPO) -> str:
    """sha256 over the code a run executes (src/, workflow/, Snakefile, perf/): it names the
    code where the copy that ran has no git history."""
    import hashlib

    h = hashlib.sha256()
    files = [repo / "Snakefile", *(repo / "src").rglob("*"), *(repo / "workflow").rglob("*"),
             *(repo / "perf").glob("*.py"), *(repo / "perf").glob("*.sh"),
             *(repo / "perf" / "gpu_checks").glob("*.py")]
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def environment(device: str) -> dict[str, Any]:
    """Versions of what ran: machine, GPU, driver, CUDA, torch, transformers and the pins."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "transformers": transformers.__version__, "transformers_path": str(Path(transformers.__file__).parent),
    }
    names = ["transformers", "tokenizers", "huggingface-hub", "safetensors", "snakemake", "numpy", "pyarrow",
             "pandas", "jsonschema"]
    env["packages"] = {n: _version(n) for n in names}
    locked = locked_versions(names)
    env["differs_from_lock"] = {n: {"here": env["packages"][n], "lock": locked[n]} for n in names
                                if locked[n] and env["packages"][n] != locked[n]}
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                           check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        env["git_commit"] = None
    env["code_sha256"] = code_digest()
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                      "multiprocessors": props.multi_processor_count,
                      "capability": f"{props.major}.{props.minor}"}
        env["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        env["matmul_reduced_precision_bf16"] = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        env["matmul_reduced_precision_fp16"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        env["sdpa_backends_enabled"] = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                                        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                                        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                                        "math": torch.backends.cuda.math_sdp_enabled()}
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            name, driver, memory = [s.strip() for s in smi.stdout.splitlines()[0].split(",")]
            env["gpu"].update(driver=driver, nvidia_smi_name=name, nvidia_smi_memory=memory)
        except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
            env["gpu"]["driver"] = None
    return env
