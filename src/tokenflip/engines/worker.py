"""The one protocol of out-of-process engines: an engine that runs in another interpreter
(vLLM pins its own torch and transformers; a live endpoint's client needs no model at all)
gets a request as a JSON file and writes its response as a JSON file, atomically.

    <interpreter> -I <worker.py> REQUEST.json RESPONSE.json

The cell job stays in tokenflip's environment: it encodes the prompts, starts the worker,
reads back per-prompt ids and top-k logits (or logprobs) and what the engine resolved, then
the cell runner scores, checks and writes the cell as for every engine. The worker's own log
goes to the job's log. A worker that fails, or leaves no response, fails the cell naming the
worker and its exit status; nothing is written. A worker script imports only the standard
library and its engine (it runs isolated, in the engine's environment, where tokenflip is
not installed), so it writes its response itself: to RESPONSE.json.partial, then renamed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


class WorkerError(RuntimeError):
    pass


def call(interpreter: str | Path, worker: Path, request: dict[str, Any], env: dict[str, str], scratch: Path,
         what: str) -> dict[str, Any]:
    """Run `worker` under `interpreter` on `request`; its response. `scratch`: a folder of
    the job's own (the request and response live in a temporary folder inside it, removed
    after), `what`: the engine, for messages."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".worker.", dir=scratch) as tmp:
        req_path, resp_path = Path(tmp) / "request.json", Path(tmp) / "response.json"
        req_path.write_text(json.dumps(request))
        # Isolated mode (-I): neither the worker's own folder (this package) nor user
        # site-packages or PYTHON* variables reach the worker's imports.
        proc = subprocess.run([str(interpreter), "-I", str(worker), str(req_path), str(resp_path)],
                              env={**os.environ, **env}, stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode != 0 or not resp_path.exists():
            raise WorkerError(f"{what}: the worker ({interpreter} {worker.name}) failed with exit code "
                              f"{proc.returncode}; its own message is in this job's log above")
        try:
            return json.loads(resp_path.read_text())
        except json.JSONDecodeError as exc:
            raise WorkerError(f"{what}: the worker's response is not JSON ({exc})") from None
