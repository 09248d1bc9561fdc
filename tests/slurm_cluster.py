"""A real single-node SLURM cluster for the tests, started by hand and torn down again.

Debian's `munge`, `slurmctld`, `slurmd` and `slurm-client` run from a private temp dir:
their own munge key and socket (passed to Slurm as `AuthInfo=socket=...`), their own
slurm.conf (clients find it through `SLURM_CONF`), their own ports, state and spool
directories, no systemd, no accounting (no slurmdbd). The node is the machine itself as
`slurmd -C` describes it, with one fake GPU (`Gres=gpu:1`, `File=/dev/null`) so that
`--gpus=1` jobs schedule, and `DefMemPerCPU` so jobs share the node. Nothing global is
touched, and teardown stops exactly the daemons started here, by PID.

The jobstep executor of snakemake-executor-plugin-slurm strips `SLURM_*` variables
(SLURM_CONF among them) before it calls `srun` inside a job, so the cluster also provides
a `bin/` directory with an `srun` that restores SLURM_CONF; it goes first on PATH.

Missing packages (or not running as root) skip the tests locally and fail them in CI
(`CI` set in the environment): `.ci/system-packages.sh` installs what is needed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
PARTITIONS = ("cpu", "gpu")  # the names the workflow's SLURM profile uses
MEM_PER_CPU_MB = 1000


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    env: dict[str, str]
    logs: dict[str, Path]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    files: list = field(default_factory=list)

    def stderr_file(self, name: str):
        handle = (self.root / "log" / f"{name}.stderr").open("w")
        self.files.append(handle)
        return handle

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def log_tail(self, n: int = 40) -> str:
        out = []
        for name, path in self.logs.items():
            lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else ["(no log)"]
            out.append(f"--- {name} ({path})\n" + "\n".join(lines))
        return "\n".join(out)


def missing_requirements() -> list[str]:
    missing = [exe for exe in (*DAEMONS, *CLIENTS) if shutil.which(exe, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    try:
        pwd.getpwnam("munge")
    except KeyError:
        missing.append("user 'munge'")
    if os.geteuid() != 0:
        missing.append("root (slurmd must run as root)")
    return missing


def _which(exe: str) -> str:
    found = shutil.which(exe, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    assert found, exe
    return found


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports free now: each socket stays bound until all are chosen, so two
    calls cannot be handed the same port."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _node_line() -> tuple[str, str]:
    """NodeName=... CPUs=... RealMemory=... exactly as slurmd measures this machine."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("NodeName="))
    name = line.split()[0].split("=", 1)[1]
    return name, line


def _wait(predicate, timeout: float, what: str, cluster: SlurmCluster | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if cluster:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}\n{cluster.log_tail()}")
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{cluster.log_tail() if cluster else ''}")


def write_config(root: Path) -> tuple[Path, str]:
    node, node_line = _node_line()
    munge_socket = root / "munge" / "munge.socket"
    for d in ("state", "spool", "log", "run"):
        (root / d).mkdir(exist_ok=True)
    partitions = "\n".join(
        f"PartitionName={p} Nodes={node} Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE State=UP"
        for i, p in enumerate(PARTITIONS))
    conf = root / "slurm.conf"
    ctld_port, slurmd_port = _free_ports(2)
    conf.write_text(f"""\
# Written by tests/slurm_cluster.py; a throwaway single-node cluster.
ClusterName=tokenflip-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}
SlurmdPidFile={root / 'run' / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={MEM_PER_CPU_MB}
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# squeue keeps finished jobs this long; the plugin only trusts squeue when it is >= 3x its
# first status-check delay (else it falls back to sacct, which needs slurmdbd).
MinJobAge=600
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
{node_line} NodeAddr=127.0.0.1 Gres=gpu:1 State=UNKNOWN
{partitions}
""")
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File=/dev/null\n")
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
    return conf, node


def start(root: Path) -> SlurmCluster:
    """Writes the config, starts munged, slurmctld and slurmd, waits for an idle node."""
    root.chmod(0o755)
    conf, node = write_config(root)
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o700, exist_ok=True)
    munge = pwd.getpwnam("munge")
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for p in (munge_dir, key):
        os.chown(p, munge.pw_uid, munge.pw_gid)
    munge_dir.chmod(0o755)  # clients (jobs) reach the socket; munged wants no group/other write

    bin_dir = root / "bin"  # srun inside jobs loses SLURM_CONF (see module docstring)
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(f'#!/bin/sh\nSLURM_CONF={conf}\nexport SLURM_CONF\nexec {_which("srun")} "$@"\n')
    srun.chmod(0o755)

    env = dict(os.environ)
    env.update(SLURM_CONF=str(conf), PATH=f"{bin_dir}:{env.get('PATH', '')}")
    for var in [v for v in env if v.startswith(("SBATCH_", "SRUN_", "SQUEUE_", "SLURM_")) and v != "SLURM_CONF"]:
        del env[var]
    logs = {"munged": munge_dir / "munged.log", "slurmctld": root / "log" / "slurmctld.log",
            "slurmd": root / "log" / "slurmd.log"}
    cluster = SlurmCluster(root=root, conf=conf, node=node, env=env, logs=logs)
    try:
        cluster.procs["munged"] = subprocess.Popen(
            [_which("munged"), "--foreground", "--force", f"--socket={munge_dir / 'munge.socket'}",
             f"--key-file={key}", f"--pid-file={munge_dir / 'munged.pid'}",
             f"--seed-file={munge_dir / 'munged.seed'}", f"--log-file={munge_dir / 'munged.log'}"],
            user=munge.pw_uid, group=munge.pw_gid, extra_groups=[], cwd=munge_dir, env=env,
            stdout=subprocess.DEVNULL, stderr=cluster.stderr_file("munged"), start_new_session=True)
        _wait(lambda: (munge_dir / "munge.socket").exists(), 30, "munged's socket", cluster)

        cluster.procs["slurmctld"] = subprocess.Popen(
            [_which("slurmctld"), "-D", "-i", "-f", str(conf)], env=env, cwd=root,
            stdout=subprocess.DEVNULL, stderr=cluster.stderr_file("slurmctld"), start_new_session=True)
        _wait(lambda: cluster.run("scontrol", "ping").stdout.count("UP") >= 1, 60, "slurmctld", cluster)

        cluster.procs["slurmd"] = subprocess.Popen(
            [_which("slurmd"), "-D", "-f", str(conf), "-N", node], env=env, cwd=root,
            stdout=subprocess.DEVNULL, stderr=cluster.stderr_file("slurmd"), start_new_session=True)

        def node_idle() -> bool:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
            return bool(out) and all(state == "idle" for state in out)

        _wait(node_idle, 90, "the node to be idle", cluster)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: SlurmCluster) -> None:
    """Cancels leftover jobs, then stops exactly the daemons started here (by PID)."""
    if "slurmctld" in cluster.procs and cluster.procs["slurmctld"].poll() is None:
        try:
            cluster.run("scancel", "--user", str(os.geteuid()), timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass
    for name in ("slurmd", "slurmctld", "munged"):
        proc = cluster.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for handle in cluster.files:
        handle.close()


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_requirements()
    if missing:
        message = ("a real SLURM cluster needs " + ", ".join(missing)
                   + " (Debian: .ci/system-packages.sh installs slurmctld slurmd slurm-client munge)")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    root = Path(tempfile.mkdtemp(prefix="tokenflip-slurm-"))
    cluster = start(root)
    try:
        yield cluster
    finally:
        stop(cluster)
        if not os.environ.get("TOKENFLIP_KEEP_SLURM"):
            shutil.rmtree(root, ignore_errors=True)
