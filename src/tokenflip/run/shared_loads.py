"""One model load for every generation job that shares it.

A generation job's own work is its prompts; starting an interpreter, importing torch and
transformers, loading and verifying the weights cost a small model's job more than its
prompts do, and a study in rounds runs a job per block. So a transformers job hands itself
to a warm process that already holds its load, and exits with that job's status:

- A load is what a job's model depends on: the prepared model (its manifest's digest and
  files), the precision it computes in, the device, the attention implementation, the
  deterministic setting, the job's threads, the interpreter and tokenflip's own source, and
  the environment that steers its kernels (threads, CUDA, tokenflip's scheduler: a warm
  process serves one run). Jobs whose load is not reusable
  (interventions that rewire the model, compiled steps, other engines) run in their own
  process as before.
- Each warm process serves one job at a time, through a slot the job holds (a file lock):
  jobs that run side by side get a process each, as they would without sharing, and a job
  never waits for another. A new load sends idle processes of other loads away, so memory
  holds no more models than jobs run at once; an idle process leaves after `IDLE_SECONDS`,
  or at once when the scheduler that started it is gone.
- The job hands over its stdout and stderr (the job's log) and its process id: the warm
  process writes its log lines there, records the job's seconds from the job's own process,
  and stops at once, writing nothing, if the job ends before it answers (Snakemake killed it).

A job's result is the same whether its load was warm or fresh (the suite checks token ids and
logits, bit for bit). `TOKENFLIP_SHARE_LOADS=0` turns sharing off; under SLURM each job is a
cluster job of its own and loads its model itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["hand_over", "load_key", "serve", "IDLE_SECONDS", "SHARE_VARIABLE"]

SHARE_VARIABLE = "TOKENFLIP_SHARE_LOADS"
# Long enough to span a round's checkpoint and joins, short enough not to hold memory after a run.
IDLE_SECONDS = 60.0
# How long a job waits for a warm process it started to listen (it imports nothing heavy first).
START_SECONDS = 30.0
# The most warm processes of one load (one per job running at once).
MAX_SLOTS = 64
# The environment that steers what a load computes or where it runs.
_STEERING = ("OMP_", "MKL_", "OPENBLAS_", "CUDA_", "PYTORCH_", "TORCH_", "HF_", "TRANSFORMERS_", "TOKENFLIP_",
             "ONEDNN_", "DNNL_", "KMP_", "GOMP_", "LD_PRELOAD", "LD_LIBRARY_PATH", "CUBLAS_", "NVIDIA_", "ATEN_",
             "PYTHON")
# Cluster jobs: their processes go with the job, and their host's scheduler is not watched here.
_CLUSTER_JOBS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID")
# The longest path a Unix socket can be bound at (sun_path's 108 bytes, its final NUL).
_LONGEST_ADDRESS = 107


def enabled() -> bool:
    """Sharing is on unless turned off, and never inside a cluster job (its process goes with it)."""
    return os.environ.get(SHARE_VARIABLE, "1") != "0" and not any(os.environ.get(v) for v in _CLUSTER_JOBS)


def runtime_dir() -> Path | None:
    """This user's private folder of warm processes' sockets and slot locks (None where it
    cannot be private: another user's, or open to others)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"tokenflip-loads-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = base.lstat()
    except OSError:
        return None
    if base.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return base


def _source_identity() -> str:
    """tokenflip's own source as this interpreter would import it (a changed file: another load)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"{sys.executable}\0{root}".encode())
    for path in sorted(root.rglob("*.py")):
        info = path.stat()
        digest.update(f"{path}\0{info.st_mtime_ns}\0{info.st_size}\0".encode())
    return digest.hexdigest()


def load_key(job, model_dir: str | Path) -> str | None:
    """The digest of what `job`'s loaded model depends on, or None when its load cannot be
    shared (another engine, an intervention that rewires the model, a compiled decode step)."""
    from tokenflip.run.engines.transformers_loop import TRANSFORMERS

    cell = job.cell
    if cell.engine != TRANSFORMERS or job.intervention.get("kind", "none") != "none" or cell.compile != "off":
        return None
    model_dir = Path(model_dir).resolve()
    try:  # the manifest (its weights' digest) and every file as it is now: an edited file, another load
        manifest = hashlib.sha256((model_dir / "model.json").read_bytes()).hexdigest()
        files = sorted(f"{p.relative_to(model_dir)}:{p.stat().st_mtime_ns}:{p.stat().st_size}"
                       for p in model_dir.rglob("*") if p.is_file())
    except OSError:
        return None
    steering = sorted((k, v) for k, v in os.environ.items() if k.startswith(_STEERING) and k != SHARE_VARIABLE)
    parts = [_source_identity(), str(model_dir), manifest, *files, cell.precision, str(job.device), cell.attention,
             cell.deterministic, str(job.threads), json.dumps(steering)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def make_room() -> None:
    """Send away every idle warm process: a job about to load a model of its own (one whose
    load is not shared, a probe) does not load it beside models no job is using."""
    if enabled() and (base := runtime_dir()) is not None:
        _dismiss_idle(base, "")


def hand_over(job, job_json: str, model_dir: str | Path, out: str | Path, quiet: bool, worker: str) -> int | None:
    """Run `job` in a warm process holding its load (module `worker` started as one where
    none runs); its exit status (None: run it here, as sharing is off or the job's load is
    not shareable)."""
    if not enabled() or (base := runtime_dir()) is None:
        return None
    if (key := load_key(job, model_dir)) is None:
        _dismiss_idle(base, "")
        return None
    slot = _take_slot(base, key)
    if slot is None:
        return None
    number, lock = slot
    try:
        address = str(base / f"{key}.{number}.sock")
        if len(os.fsencode(address)) > _LONGEST_ADDRESS:
            return None
        connection = _connect(address)
        if connection is None:
            _dismiss_idle(base, key)
            _start(address, worker)
            connection = _connect(address, wait=START_SECONDS)
        if connection is None:
            print(f"tokenflip generate: no warm process answered (its log: {address[:-5]}.log); loading the model "
                  f"in this job", file=sys.stderr)
            return None
        request = {"job": job_json, "model_dir": str(Path(model_dir).resolve()), "out": str(Path(out).absolute()),
                   "quiet": quiet, "cwd": os.getcwd(), "umask": _umask(), "pid": os.getpid(), "argv0": sys.argv[0]}
        sys.stdout.flush()
        sys.stderr.flush()
        with connection:
            try:
                socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [1, 2])
            except OSError:  # it left as the job came: nothing of the job ran there
                return None
            try:
                answer = _read_line(connection)
            except OSError:
                answer = None
        if answer is None:
            print(f"tokenflip generate: the warm process holding this job's load ended without an answer "
                  f"(killed, or out of memory); nothing was written", file=sys.stderr)
            return 1
        return int(json.loads(answer)["status"])
    finally:
        lock.close()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _take_slot(base: Path, key: str):
    """The first free slot of `key`, held (its lock file open and locked) until the job ends."""
    for number in range(MAX_SLOTS):
        lock = open(base / f"{key}.{number}.lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return number, lock
    return None


def _connect(address: str, wait: float = 0.0) -> socket.socket | None:
    deadline = time.monotonic() + wait
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(address)
            return connection
        except OSError:
            connection.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


def _start(address: str, worker: str) -> None:
    """A warm process for the slot at `address`, in a session of its own (it outlives this job);
    what it says outside any job goes to the slot's log beside its socket."""
    with open(address[: -len(".sock")] + ".log", "a") as log:
        subprocess.Popen([sys.executable, "-m", worker, address], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True)


def _dismiss_idle(base: Path, key: str) -> None:
    """Send away the idle warm processes of other loads (their slot free): a new load does not
    sit in memory beside models no job is using."""
    for path in base.glob("*.lock"):
        if path.name.startswith(key + "."):
            continue
        with open(path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # in use by a job
            address = path.with_suffix(".sock")
            connection = _connect(str(address))
            if connection is not None:
                with connection:
                    connection.settimeout(10.0)
                    try:  # the process answers by exiting, the connection still open: its memory is free then
                        connection.sendall(b'{"leave": true}\n')
                        connection.recv(1)
                    except OSError:
                        pass


def _read_line(connection: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(4096)
        if not chunk:
            return None
        data += chunk
    return data


# --- The warm process -----------------------------------------------------------------------

def serve(address: str, run: Callable[[list[str]], int]) -> None:
    """Listen at `address` and run the jobs handed over (`run(argv)`: a `tokenflip` command's
    exit status), one at a time, with their load kept; leave when idle for `IDLE_SECONDS`,
    when told to, or when the scheduler is gone."""
    if os.path.exists(address):
        os.unlink(address)  # a socket left by a process that was killed: this slot is ours (its lock held)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)  # first: the job that started this process waits for it
    listener.listen(4)
    listener.settimeout(1.0)
    from tokenflip.core.scheduler import scheduler_gone
    from tokenflip.run.engines.transformers_loop import keep_loads

    keep_loads()
    idle_since = time.monotonic()
    while True:
        if time.monotonic() - idle_since >= IDLE_SECONDS or scheduler_gone():
            if _leave(address):
                return
            idle_since = time.monotonic()  # a job holds the slot and is about to hand itself over
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        with connection:
            status = _serve_one(connection, run)
            if status is None or status != 0:
                # Told to leave, or a job failed: a failure may leave the process's state (a CUDA
                # error, memory) worse than a fresh one's; the next job starts a fresh process.
                os.unlink(address)
                os._exit(0)
        idle_since = time.monotonic()


def _leave(address: str) -> bool:
    """Leave when no job holds this slot (its lock taken here, so none can hand itself over
    while the socket goes); False when a job holds it."""
    lock = open(address[: -len(".sock")] + ".lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return False
    try:
        os.unlink(address)
    except OSError:
        pass
    os._exit(0)


def _serve_one(connection: socket.socket, run: Callable[[list[str]], int]) -> int | None:
    """One request: a job (run it; its status) or a request to leave (None)."""
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 2)
    if message and not message.endswith(b"\n"):  # the rest of a request longer than one read
        message += _read_line(connection) or b""
    request = json.loads(message or b"{}")
    if request.get("leave") or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return None if request.get("leave") else 0
    status = _run_job(request, fds, connection, run)
    try:
        connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    except OSError:
        pass
    return status


_JOBS_RUN = 0


def _run_job(request: dict[str, Any], fds: list[int], connection: socket.socket,
             run: Callable[[list[str]], int]) -> int:
    """The job, with its log as this process's stdout and stderr, in its folder and umask."""
    from tokenflip.core import scheduler
    from tokenflip.run import cell_output

    saved, argv = [os.dup(1), os.dup(2)], sys.argv
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    global _JOBS_RUN
    _JOBS_RUN += 1
    print(f"tokenflip generate: this job runs in a warm process (pid {os.getpid()}) that holds its load: its job "
          f"{_JOBS_RUN} (TOKENFLIP_SHARE_LOADS=0: every job loads its own)", file=sys.stderr, flush=True)
    finished = threading.Event()
    threading.Thread(target=_leave_if_job_ends, args=(connection, finished), daemon=True).start()
    try:
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        sys.argv = [str(request.get("argv0") or argv[0])]  # what the job's record says ran it
        cell_output.JOB_PROCESS = int(request["pid"])
        # Every write checks that the job's own process still runs (storage checks the
        # scheduler before each): a job Snakemake killed gets nothing written.
        scheduler.watch_job(int(request["pid"]))
        job = ["generate", "--job", request["job"], "--model-dir", request["model_dir"], "--out", request["out"]]
        return run([*job, *(["--quiet"] if request.get("quiet") else [])])
    except SystemExit as exc:  # argparse's usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - a defect: its traceback in the job's log, as a fresh job would
        import traceback

        traceback.print_exc()
        return 1
    finally:
        finished.set()
        scheduler.watch_job(None)
        sys.argv = argv
        cell_output.JOB_PROCESS = None
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, *fds):
            os.close(fd)


def _leave_if_job_ends(connection: socket.socket, finished: threading.Event) -> None:
    """The job's process ended before its answer (Snakemake killed it): leave at once, so that
    nothing is written for a job that no longer exists."""
    try:
        connection.recv(1, socket.MSG_PEEK)
    except OSError:
        pass
    if not finished.is_set():
        os._exit(1)

