"""Jobs do not outlive their scheduler. The Snakefile records the scheduler process (host,
pid, start time) in a variable every job inherits; a job on the same host that finds the
scheduler gone (kill -9, a closed terminal) stops at once instead of writing a result later,
possibly after the config changed. Jobs on other hosts (SLURM) are not watched: there the
cluster owns them. Storage checks it before every write."""

from __future__ import annotations

import os

SCHEDULER_VARIABLE = "TOKENFLIP_SCHEDULER"
ORPHANED_EXIT = 75


def _start_time(pid: int | str) -> str | None:
    """When process `pid` ("self": this one) started, in clock ticks since boot, as the kernel
    records it (None where it cannot be read): with the pid, it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def process_age(pid: int | str = "self") -> float | None:
    """Wall seconds since process `pid` started (None where the kernel's record cannot be read)."""
    started = _start_time(pid)
    try:
        with open("/proc/uptime") as fh:
            return max(0.0, float(fh.read().split()[0]) - int(started) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, TypeError, IndexError):
        return None


def scheduler_token(pid: int | None = None) -> str:
    """`host:pid:start-time` of a process (default: this one)."""
    import socket

    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


# The process of the job this process runs for another (a warm process holding a model
# load, `run.shared_loads`): (pid, start time), or None.
_JOB: tuple[int, str | None] | None = None


def watch_job(pid: int | None) -> None:
    """From now on (None: no longer) the job this process runs is that of process `pid`:
    when it is gone (Snakemake killed the job), so is the reason to write anything."""
    global _JOB
    _JOB = None if pid is None else (pid, _start_time(pid))


def scheduler_gone() -> str | None:
    """Why this job's scheduler, or the process of the job run here for another, is gone
    (None if they are alive or not watched here)."""
    import socket

    if _JOB is not None and (_JOB[1] is None or _start_time(_JOB[0]) != _JOB[1]):
        return f"its job's process (pid {_JOB[0]}) is gone"
    token = os.environ.get(SCHEDULER_VARIABLE)
    if not token or token.count(":") < 2:
        return None
    host, pid, start = token.rsplit(":", 2)
    if host != socket.gethostname() or start == "None" or not pid.isdigit():
        return None
    if _start_time(int(pid)) != start:
        return f"its scheduler (pid {pid} on {host}) is gone"
    return None


def exit_if_orphaned(cleanup=None) -> None:
    """Stop this process (exit 75) if its scheduler is gone, after `cleanup()`."""
    reason = scheduler_gone()
    if reason:
        import sys

        if cleanup is not None:
            cleanup()
        print(f"tokenflip: stopping: {reason}; nothing was written", file=sys.stderr, flush=True)
        os._exit(ORPHANED_EXIT)


def watch_scheduler(interval: float = 0.5) -> None:
    """Check in the background, every `interval` seconds, that the scheduler is alive; stop
    at once if it died already (on a slow machine, while this job was still starting)."""
    exit_if_orphaned()
    if os.environ.get(SCHEDULER_VARIABLE):
        import threading
        import time

        def watch():
            while True:
                exit_if_orphaned()
                time.sleep(interval)

        threading.Thread(target=watch, name="tokenflip-scheduler-watch", daemon=True).start()
