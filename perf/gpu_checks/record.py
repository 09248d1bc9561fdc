"""What every part shares: its record (rewritten after each sub-check), deadlines that
stop a process group or interrupt a call, and the transfer budget of one device call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any, Callable

PERF = Path(__file__).resolve().parent.parent
REPO = PERF.parent
TRANSFER_LIMIT = 64 * 2**20  # what one call of the device machine may carry


def log(msg: str) -> None:
    print(msg, flush=True)


def _finite(x: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those become strings."""
    if x is None:
        return None
    x = float(x)
    return x if x == x and abs(x) != float("inf") else str(x)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False, default=str))
    os.replace(tmp, path)


# --- the transfer budget ---------------------------------------------------------------


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what a call carries without `carry`: tracked files and untracked files
    that git does not ignore (the working tree's copies, as they are now)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        path = repo / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def transfer_budget(carry: Path, repo: Path = REPO, limit: int = TRANSFER_LIMIT) -> dict[str, Any]:
    """The working tree plus the carried folder against the device machine's limit."""
    tree = tree_bytes(repo)
    carried = dir_bytes(carry) if Path(carry).exists() else 0
    wheels = dir_bytes(Path(carry) / "wheels") if (Path(carry) / "wheels").exists() else 0
    return {"tree_bytes": tree, "carry_bytes": carried, "wheel_bytes": wheels, "total_bytes": tree + carried,
            "limit_bytes": limit, "fits": tree + carried < limit}


# --- a part's record, rewritten after every sub-check -----------------------------------


class Recorder:
    """What one part found so far, written to `path` after every change, with the part's deadline."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path = path
        self.deadline = deadline
        self.data: dict[str, Any] = {"status": "running", "checks": [], "skipped": []}
        self.save()

    def left(self) -> float:
        return self.deadline - time.time()

    def room(self, seconds: float, until: float | None = None) -> bool:
        """Whether `seconds` still fit before the part's deadline (or the earlier `until`)."""
        end = self.deadline if until is None else min(until, self.deadline)
        return end - time.time() > seconds

    def leaving(self, seconds: float, later: int) -> float:
        """The end of the time the item at hand may take, leaving `seconds` to each of the
        `later` items after it (where items differ in cost, an equal share starves the
        costliest)."""
        return self.deadline - seconds * later

    def share(self, index: int, count: int) -> float:
        """The end of item `index`'s equal share of the time left, among `count` items."""
        return time.time() + self.left() / (count - index)

    def save(self) -> None:
        write_json(self.path, self.data)

    def add(self, check: dict[str, Any]) -> None:
        self.data["checks"].append(check)
        self.save()

    def skip(self, name: str, why: str) -> None:
        log(f"  skipped {name}: {why}")
        self.data["skipped"].append({"name": name, "why": why})
        self.save()

    def guarded(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one sub-check; an exception becomes an `error` entry instead of ending the part."""
        t0 = time.perf_counter()
        try:
            check = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, and the next sub-check runs
            check = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()[-3000:]}
            log(traceback.format_exc())
        check = {"name": name, **check, "seconds": round(time.perf_counter() - t0, 2)}
        log(f"  {name}: {check['status'].upper()} ({check['seconds']:.1f} s)"
            + (f" {check.get('error', '')}" if check["status"] == "error" else ""))
        self.add(check)
        return check

    def finish(self, **extra: Any) -> None:
        self.data.update(extra)
        statuses = [c["status"] for c in self.data["checks"]]
        if "status" not in extra or self.data["status"] == "running":
            if not statuses or all(s == "skipped" for s in statuses):
                self.data["status"] = "skipped"
            elif all(s in ("pass", "skipped") for s in statuses):
                self.data["status"] = "pass"
            elif "error" in statuses:
                self.data["status"] = "error"
            elif "timeout" in statuses:
                self.data["status"] = "timeout"
            else:
                self.data["status"] = "fail"
        self.save()


# --- deadlines ------------------------------------------------------------------------


def run_group(cmd: list[str], timeout: float, **kwargs) -> tuple[int | None, float]:
    """Run `cmd` in its own process group; past `timeout`, end that group. (rc or None, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    try:
        rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 2)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        rc = None
    return rc, time.perf_counter() - t0


class _OutOfTime(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> tuple[Any, bool]:
    """(fn's result, False), or (None, True) when it ran past `seconds` and was interrupted
    (a timer signal raises inside it; CUDA work is asynchronous, so this lands promptly)."""
    def on_alarm(signum, frame):
        raise _OutOfTime()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.1, seconds))
    try:
        return fn(), False
    except _OutOfTime:
        return None, True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
