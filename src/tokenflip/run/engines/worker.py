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

A native engine that shares tokenflip's environment (llama.cpp) decodes out of process too,
through `isolated`: a spawned child runs the engine's decode and hands back its result, so a
crash in native code (a segfault in a CPU kernel) fails that cell, never the run or the test
session, and the message names the signal, the engine, its build and the CPU.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable


class WorkerError(RuntimeError):
    pass


class EngineCrash(WorkerError):
    """An engine's process was killed by a signal (a segfault in native code, the kernel's
    out-of-memory killer): its cell fails, nothing is written."""


def exit_status(code: int | None) -> str:
    """A process's exit status as a person reads it: "exit code 3", "signal SIGSEGV (11)"."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"signal {name} ({-code})"
    return f"exit code {code}"


def cpu_described() -> str:
    """The CPU, as a crash report names it: its model and the extensions that select kernels."""
    from tokenflip.core.cpu_flags import cpu_model, kernel_flags

    return f"{cpu_model()} [{' '.join(kernel_flags()) or 'no listed extensions'}]"


def _crash_message(what: str, code: int | None, build: Callable[[], str] | None) -> str:
    try:
        built = build() if build else "not known"
    except Exception as exc:  # the build's own description failed too: say so, keep the crash
        built = f"not readable ({type(exc).__name__}: {exc})"
    return (f"{what}: the engine's process was killed by {exit_status(code)}; engine build: {built}; "
            f"CPU: {cpu_described()}. Nothing was written; its own output is in this job's log above")


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
        if proc.returncode < 0:
            raise EngineCrash(_crash_message(f"{what} ({interpreter} {worker.name})", proc.returncode, None))
        if proc.returncode != 0 or not resp_path.exists():
            raise WorkerError(f"{what}: the worker ({interpreter} {worker.name}) failed with "
                              f"{exit_status(proc.returncode)}; its own message is in this job's log above")
        try:
            return json.loads(resp_path.read_text())
        except json.JSONDecodeError as exc:
            raise WorkerError(f"{what}: the worker's response is not JSON ({exc})") from None


def _die_with_parent(parent: int) -> None:
    """The engine's process never outlives its job: the kernel kills it when the job's
    process ends, however it ends (its scheduler gone, SIGKILL, a test's timeout). Linux's
    prctl(PR_SET_PDEATHSIG); elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the job ended before the request took effect
            os._exit(1)


def _run_child(target: Callable[..., Any], args: tuple, out: str, parent: int) -> None:
    """In the child: the target's result, or the exception it raised, pickled to `out`; the
    traceback of an exception goes to this job's log from here, so it is there whatever the
    parent can read back."""
    _die_with_parent(parent)
    try:
        outcome: tuple = ("result", target(*args))
    except Exception as exc:  # handed to the parent, which raises it there
        traceback.print_exc(file=sys.stderr)
        outcome = ("error", exc)
    partial = out + ".partial"
    with open(partial, "wb") as fh:
        try:
            pickle.dump(outcome, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # what does not pickle: its description still does
            fh.seek(0)
            fh.truncate()
            pickle.dump(("error", WorkerError(f"the engine's {outcome[0]} could not be handed back "
                                              f"({type(exc).__name__}: {exc})")), fh)
    os.replace(partial, out)


def isolated(target: Callable[..., Any], args: tuple, what: str, build: Callable[[], str] | None = None) -> Any:
    """`target(*args)` in a spawned child process (a fresh interpreter of this environment):
    its result, or the exception it raised, raised here again. A child killed by a signal
    raises `EngineCrash` naming the signal, `what` (the engine), `build()` (its build flags,
    read here after the crash) and the CPU. `target` and `args` must pickle (a module-level
    function; job specs as JSON)."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tokenflip-engine-") as tmp:
        out = os.path.join(tmp, "outcome.pickle")
        child = context.Process(target=_run_child, args=(target, args, out, os.getpid()),
                                name=f"tokenflip {what}")
        child.start()
        try:
            child.join()
        finally:  # interrupted here (Ctrl-C, an error): the engine's process goes too
            if child.is_alive():
                child.kill()
                child.join()
        if child.exitcode is not None and child.exitcode < 0:
            raise EngineCrash(_crash_message(what, child.exitcode, build))
        if not os.path.exists(out):
            raise WorkerError(f"{what}: the engine's process ended with {exit_status(child.exitcode)} and "
                              f"handed back nothing; its own output is in this job's log above")
        try:
            with open(out, "rb") as fh:
                outcome = pickle.load(fh)
        except Exception as exc:  # an exception class that pickles but does not load back
            raise WorkerError(f"{what}: the engine's process failed and its error could not be read back "
                              f"({type(exc).__name__}: {exc}); its traceback is in this job's log above") from None
    if outcome[0] == "error":
        raise outcome[1]
    return outcome[1]
