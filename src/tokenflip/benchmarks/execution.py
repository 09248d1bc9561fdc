"""Execution-based scoring: generated code is hostile input, so each program (code plus its
tests) runs in its own locked-down process, and only a run that reaches its end passes."""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

__all__ = [
    "Limits",
    "Layers",
    "ExecutionResult",
    "available_layers",
    "run_program",
    "sandbox_description",
    "UID_RANGE",
]

UID_RANGE = range(0x70000000, 0x71000000)
RUNNER = Path(__file__).with_name("_sandbox_runner.py")
TAG_VARIABLE = "TOKENFLIP_SANDBOX"
_TAIL_BYTES = 8192


@dataclass(frozen=True)
class Limits:
    """Per-sample limits. `nproc` (threads count too) is enforced only for an unprivileged uid."""

    timeout_s: float = 20.0
    cpu_s: int = 20
    memory_bytes: int = 2 * 1024**3
    file_size_bytes: int = 16 * 1024**2
    nproc: int = 16
    open_files: int = 128


@dataclass(frozen=True)
class Layers:
    """Which optional isolation layers to use; `available_layers()` gives the machine's best."""

    namespaces: bool = False
    drop_privileges: bool = False
    guard: bool = True
    read_capability: bool = field(default=False, compare=False)

    def names(self) -> list[str]:
        names = ["python -I in a temporary directory with a minimal environment", "resource limits",
                 "wall-clock timeout killing the process group", "success nonce"]
        if self.guard:
            names.append("in-process guard")
        if self.namespaces:
            names.append("network and PID namespaces (unshare)")
        if self.drop_privileges:
            names.append("a fresh unprivileged uid/gid per sample, no capabilities"
                         + (" but CAP_DAC_READ_SEARCH" if self.read_capability else "") + " (setpriv)")
        return names


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one program: `passed` only if it ran to the end and printed the nonce. `status`
    is passed, failed, timeout, exited early, killed by SIG..., syntax error or no code."""

    passed: bool
    status: str
    returncode: int | None
    wall_s: float
    stdout: str
    stderr: str


def _world_readable(path: str) -> bool:
    p = Path(path).resolve()
    for part in [p, *p.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH or (part == p and not mode & stat.S_IROTH):
            return False
    return True


def _python_readable_by_anyone(python: str) -> bool:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(str(RUNNER.parent))
    dirs.add(str(Path(python).resolve().parent))
    return all(_world_readable(d) for d in dirs)


def _prefix(layers: Layers, uid: int = UID_RANGE.start) -> list[str]:
    cmd: list[str] = []
    if layers.namespaces:
        cmd += ["unshare", "--net", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            cmd.append("--map-root-user")
        cmd += ["/bin/sh", "-c", '"$@"; exit $?', "sandbox-init"]
    if layers.drop_privileges:
        caps = "-all,+dac_read_search" if layers.read_capability else "-all"
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}", "--no-new-privs"]
    return cmd


def _works(layers: Layers, python: str) -> bool:
    cmd = _prefix(layers) + [python, "-I", "-c", "import json, decimal, heapq"]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              cwd="/", env={"PATH": os.defpath, "LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=None)
def available_layers(python: str = sys.executable) -> Layers:
    """The strongest combination of namespaces and privilege drop that works here (probed once)."""
    read_cap = not _python_readable_by_anyone(python)
    root = os.geteuid() == 0
    candidates = [
        Layers(namespaces=True, drop_privileges=root, read_capability=read_cap and root),
        Layers(namespaces=True),
        Layers(drop_privileges=root, read_capability=read_cap and root),
        Layers(),
    ]
    for layers in candidates:
        if (not layers.namespaces or shutil.which("unshare")) and (
                not layers.drop_privileges or shutil.which("setpriv")) and _works(layers, python):
            return layers
    return Layers()


def _processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid and fields[b"State"].split()[0] not in (b"Z", b"X"):
                pids.append(int(entry))
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return pids


def tagged_processes(tag: str | None = None) -> list[int]:
    """Pids of live processes started by a sandbox (any sandbox if `tag` is None)."""
    needle = f"{TAG_VARIABLE}={tag}".encode() if tag else f"{TAG_VARIABLE}=".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if any(var.startswith(needle) for var in environ.split(b"\0")):
            pids.append(int(entry))
    return pids


def _signal_all(pids, signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _kill_all(find, rounds: int = 100) -> None:
    """Freeze every process `find` returns until no new ones appear, then kill them all."""
    for _ in range(rounds):
        stopped: set[int] = set()
        while (found := set(find())) - stopped:
            _signal_all(found - stopped, signal.SIGSTOP)
            stopped |= found
        if not stopped:
            return
        _signal_all(stopped, signal.SIGKILL)
        time.sleep(0.005)


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Wait for `pid` to exit without reaping it, so its process group id stays reserved."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(0, int(timeout * 1000))))
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)


def _tail(f) -> bytes:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - _TAIL_BYTES))
    return f.read()


def _status(returncode: int, timed_out: bool, finished: bool) -> str:
    if timed_out:
        return "timeout"
    if finished and returncode == 0:
        return "passed"
    if returncode == 0:
        return "exited early"
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if signum is not None:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            pass
    return "failed"


def run_program(program: str, limits: Limits = Limits(), *, layers: Layers | None = None,
                python: str = sys.executable) -> ExecutionResult:
    """Run `program` (untrusted source text) in its own process and report whether it ran to its
    end without an exception; never raises for anything the program does.

    Layers, outermost first: new network and PID namespaces (`unshare`; the PID namespace dies
    with its first process, taking every descendant along); a fresh unprivileged uid with no
    capabilities except, where the interpreter is not world-readable, CAP_DAC_READ_SEARCH
    (`setpriv`, only as root); resource limits (CPU, address space, file size, processes, open
    files) that the child sets on itself, hard, before the program runs; an in-process guard that
    disables process creation, signals, sockets and writes outside the working directory;
    `python -I` in a fresh temporary directory with a minimal environment; a wall-clock timeout
    that kills the process group, then every process of the sample's uid (and an alarm in the
    child in case the parent dies first); and a nonce, known only to the parent and the runner,
    printed only after the whole program has run. The program runs as module `solution`, so (as
    in the reference harnesses) `if __name__ == "__main__"` blocks are skipped.
    `layers=None` uses the strongest combination this machine supports."""
    if layers is None:
        layers = available_layers(python)
    elif layers.drop_privileges and not layers.read_capability:
        layers = replace(layers, read_capability=available_layers(python).read_capability)
    nonce, tag = secrets.token_hex(16), secrets.token_hex(8)
    work = tempfile.mkdtemp(prefix="tokenflip-sandbox-")
    try:
        program_path = Path(work, "solution.py")
        program_path.write_text(program, encoding="utf-8", errors="replace")
        uid = UID_RANGE.start + secrets.randbelow(len(UID_RANGE))
        nproc = None
        if layers.drop_privileges:
            os.chown(work, uid, uid)
            nproc = limits.nproc
        elif os.geteuid() != 0:
            nproc = len(_processes_of(os.geteuid())) + limits.nproc
        config = {
            "nonce": nonce,
            "program": str(program_path),
            "guard": layers.guard,
            "limits": {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                       "file_size_bytes": limits.file_size_bytes, "open_files": limits.open_files,
                       "nproc": nproc, "alarm_s": math.ceil(limits.timeout_s) + 2},
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", TAG_VARIABLE: tag}
        cmd = _prefix(layers, uid) + [python, "-I", "-B", str(RUNNER)]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    start_new_session=True, close_fds=True)
            try:
                try:
                    proc.stdin.write(json.dumps(config).encode())
                    proc.stdin.close()
                except OSError:
                    pass
                exited = _wait_unreaped(proc.pid, limits.timeout_s)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                returncode = proc.wait()
                wall = time.monotonic() - start
                if layers.drop_privileges:
                    _kill_all(lambda: _processes_of(uid))
                else:
                    _kill_all(lambda: tagged_processes(tag))
            stdout, stderr = _tail(out), _tail(err)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = stdout.rstrip(b"\n").split(b"\n")
    finished = lines[-1] == nonce.encode()
    if finished:
        stdout = b"\n".join(lines[:-1])
    status = _status(returncode, not exited, finished)
    return ExecutionResult(passed=status == "passed", status=status, returncode=returncode, wall_s=wall,
                           stdout=stdout.decode("utf-8", "replace"), stderr=stderr.decode("utf-8", "replace"))


def sandbox_description(limits: Limits = Limits(), layers: Layers | None = None) -> dict:
    """The sandbox a benchmark scores with, for provenance."""
    layers = layers or available_layers()
    return {
        "runner": "tokenflip.benchmarks.execution (one process per sample)",
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "layers": layers.names(),
        "limits": asdict(limits),
    }
