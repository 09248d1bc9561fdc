"""The scorer's contract as data: what it guarantees (and the gaps it knows), the limits a
sample runs under, the isolation layers a machine provides, a test program, a result."""

from __future__ import annotations

from dataclasses import dataclass

TAG_VARIABLE = "TOKENFLIP_SANDBOX"

GUARANTEES = {
    "verdict": "the verdict is decided by a separate trusted test process; only plain data crosses from the "
               "candidate, so forged success markers and always-equal objects cannot pass",
    "filesystem": "the candidate sees only the interpreter and its standard library, read-only (no tests, "
                  "no site-packages, no repository, no home), and a private tmpfs bounded in bytes and in "
                  "inodes (files, directories, links and symlinks all count)",
    "isolation": "fresh user, PID, network, IPC and UTS namespaces: no network, no foreign sockets or "
                 "processes, a private IPC namespace (SysV objects and POSIX queues of its own), an "
                 "unprivileged uid without capabilities",
    "one task": "the candidate cannot create processes or threads (seccomp), so its resource limits hold "
                "for the whole sample and it holds one task's kernel memory",
    "lifetime": "the sandbox dies with the scorer, even on kill -9, and leaves no files behind",
    "memory": "memory limits hold for the whole sample: no kernel object that holds memory outside the "
              "address-space limit can be made (SysV shared memory, semaphores and message queues, POSIX "
              "message queues, memfd_create, memfd_secret, io_uring, Linux AIO, inotify, fanotify, keyrings, "
              "bpf, perf events, userfaultfd, POSIX timers, Landlock rulesets, stacked seccomp filters, a "
              "private futex hash, extended attributes and ACLs, byte-range file locks, pipes resized past "
              "their default), and each kernel object it can make is bounded by a limit (docs/sandbox.md "
              "lists every class); seccomp",
    "no sockets": "no socket can be made by any route (socket, socketpair, io_uring's socket operation), so "
                  "no file descriptors in flight past the open-files limit; seccomp",
    "no reach into processes": "no ptrace, process_vm_readv/writev, process_madvise or pidfd calls, and no "
                               "new namespaces or mounts; seccomp",
}
# The guarantees the seccomp filter (`seccomp.DENIED`) gives.
SECCOMP_GUARANTEES = ("one task", "memory", "no sockets", "no reach into processes")
# What the limits do not bound, recorded beside the guarantees in every cell's provenance.
GAPS = ("lookups of paths that do not exist leave negative dentries in the host's directory cache: "
        "reclaimable (the kernel frees them under memory pressure) but not bounded by the sample's limits "
        "(about 25 MiB a second of lookups)",)


@dataclass(frozen=True)
class Limits:
    """Per-sample limits. `timeout_s` is wall-clock for the whole sample (every call included);
    memory, CPU, file size, open files and queued signals hold for each of its two processes;
    the scratch (`workdir_bytes`, `workdir_inodes`) is each process's own."""

    timeout_s: float = 20.0
    cpu_s: int = 20
    memory_bytes: int = 2 * 1024**3
    file_size_bytes: int = 16 * 1024**2
    workdir_bytes: int = 64 * 1024**2
    workdir_inodes: int = 1024
    open_files: int = 128
    pending_signals: int = 64
    nproc: int = 16


@dataclass(frozen=True)
class Layers:
    """The isolation this machine provides (probed once by `available_layers`)."""

    bwrap: str | None = None
    bwrap_version: str | None = None
    seccomp: bool = False
    guard: bool = True
    problem: str | None = None

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    @property
    def missing(self) -> tuple[str, ...]:
        """The guarantees of `GUARANTEES` this machine cannot give."""
        if not self.sandboxed:
            return ("filesystem", "isolation", *SECCOMP_GUARANTEES, "lifetime")
        return () if self.seccomp else SECCOMP_GUARANTEES

    def names(self) -> list[str]:
        names = ["trusted test process separate from the candidate process, plain data between them",
                 "python -I with a minimal environment", "resource limits", "wall-clock timeout"]
        if self.sandboxed:
            names.append(f"bubblewrap ({self.bwrap_version}): read-only interpreter and standard library only, "
                         "private tmpfs bounded in bytes and inodes, new user/PID/network/IPC/UTS namespaces, "
                         "unprivileged uid, no capabilities, dies with the scorer")
        if self.seccomp:
            names.append("seccomp: no processes or threads, no kernel objects outside the limits, no sockets, "
                         "no reach into other processes, no namespaces or mounts")
        if not self.sandboxed and self.guard:
            names.append("in-process guard (a convenience, not a boundary)")
        return names


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sample. `status` is passed, failed, timeout, syntax error, no code or
    sandbox error; stdout and stderr are the candidate's and the test process's, for diagnosis."""

    passed: bool
    status: str
    returncode: int | None
    wall_s: float
    stdout: str
    stderr: str


@dataclass(frozen=True)
class TestProgram:
    """What the trusted test process runs: `prelude` (dataset code, e.g. imports and helpers),
    then `proxies` (names the solution defines) are bound to the candidate, then `tests`."""

    __test__ = False  # not a pytest class

    prelude: str
    tests: str
    proxies: tuple[str, ...]
