"""The seccomp program each sandboxed process runs under. It keeps a sample to one task and to
what its limits bound: every kernel interface that creates a process or thread, holds memory
outside the address-space limit (or multiplies a kernel object no limit counts), makes a socket,
or reaches another process or the mount table is refused.

Two copies are loaded, and the process runs under both: bubblewrap loads the first (`bwrap
--seccomp FD` takes a compiled classic-BPF program) before the sandbox's start stage
(`_confine`) runs, and that copy lets the start stage mount the bounded scratch and load the
second, complete one (`START_STAGE`); the complete one refuses those calls too.

The classes are data (`DENIED`, `DENIED_OPERATIONS`), so the contract and the docs name them;
numbers are per architecture and checked against the kernel headers where a test finds them.
Syscalls numbered from `FIRST_UNREVIEWED` on are newer than this table (Linux 6.17) and fail
with ENOSYS, as on an older kernel, until someone has looked at what they create."""

from __future__ import annotations

import functools
import os
import struct

__all__ = ["DENIED", "DENIED_OPERATIONS", "START_STAGE", "FIRST_UNREVIEWED", "SYSCALL_NUMBERS", "PIPE_RESIZE",
           "seccomp_program"]

# Each class: why it is refused, and the syscalls that make up the class. Process and thread
# creation (clone, clone3, fork, vfork) is refused apart, with the errors the C library expects.
# Figures: AMD EPYC, 2 cores, Linux 6.18, under a 256 MiB limit (docs/sandbox.md).
DENIED = {
    "kernel memory": ("held outside the address-space limit (and kept after the memory is unmapped): "
                      "SysV shared memory, semaphores and message queues, POSIX message queues, memory files, "
                      "secret memory, io_uring and Linux AIO rings, inotify and fanotify marks, keyrings, "
                      "BPF maps, perf buffers, userfaultfd, POSIX timers, Landlock rulesets (2.8 million port "
                      "rules held 196 MiB in 8 s), stacked seccomp filters (3,616 held 23 MiB)",
                      ("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
                       "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
                       "mq_timedreceive", "mq_notify", "mq_getsetattr", "memfd_create", "memfd_secret",
                       "io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_destroy",
                       "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "inotify_init",
                       "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark", "add_key",
                       "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "timer_create",
                       "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "seccomp")),
    "extended attributes": ("a file's extended attributes and ACLs are kernel memory: on tmpfs, 342,264 user "
                            "attributes of 4 KB held 1.3 GiB in 8 s (since Linux 6.6 bounded only by the inode "
                            "space), and ACLs are outside even that",
                            ("setxattr", "lsetxattr", "fsetxattr", "setxattrat")),
    "sockets": ("a socket by any route (io_uring's socket operation, a second route, goes with io_uring "
                "in the class above): no network even inside the namespace, and no descriptors in flight "
                "past the open-files limit", ("socket", "socketpair")),
    "other processes": ("another process's memory, descriptors or signals",
                        ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_open",
                         "pidfd_getfd", "pidfd_send_signal")),
    "namespaces and mounts": ("new namespaces and mounts (refused without capabilities already; here too)",
                              ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree",
                               "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
                               "open_tree_attr")),
}
# Operations of an allowed syscall, refused by the value of one argument: class -> (why, syscall,
# argument index, {operation: value}).
DENIED_OPERATIONS = {
    "pipe resizing": ("a pipe of 1 MiB holds 16 times what the open-files limit allows for; the default "
                      "64 KiB pipe is allowed", "fcntl", 1, {"F_SETPIPE_SZ": 1031}),
    "byte-range locks": ("each locked range is a kernel object (about 216 bytes) that no limit counts "
                         "(RLIMIT_LOCKS is not enforced by Linux); flock, one per open file, is allowed",
                         "fcntl", 1, {"F_SETLK": 6, "F_SETLKW": 7, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38}),
    "process-wide kernel tables": ("a private futex hash of 2^24 slots held 1 GiB from one call; a seccomp "
                                   "filter stack grows by each filter", "prctl", 0,
                                   {"PR_SET_SECCOMP": 22, "PR_FUTEX_HASH": 78}),
}
# fcntl(fd, F_SETPIPE_SZ, n), kept by name for the pipe test.
PIPE_RESIZE = DENIED_OPERATIONS["pipe resizing"][3]["F_SETPIPE_SZ"]
# What the start stage does before it loads the complete filter, which refuses these too: a
# private mount namespace (unshare(CLONE_NEWNS), and no other flag), the scratch mount, and the
# filter itself.
START_STAGE = {"syscalls": ("mount", "seccomp"), "unshare": 0x00020000, "prctl": ("PR_SET_SECCOMP",)}
FIRST_UNREVIEWED = 470

# From the kernel's asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64); a name an
# architecture lacks (fork, vfork, inotify_init on aarch64) is absent.
SYSCALL_NUMBERS = {
    "x86_64": {
        "clone": 56, "clone3": 435, "fork": 57, "vfork": 58, "fcntl": 72, "prctl": 157, "seccomp": 317,
        "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
        "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "setxattrat": 463, "open_tree_attr": 467,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240,
        "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "memfd_create": 319, "memfd_secret": 447, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "io_setup": 206, "io_destroy": 207, "io_submit": 209, "io_cancel": 210,
        "io_getevents": 208, "io_pgetevents": 333, "inotify_init": 253, "inotify_init1": 294,
        "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301, "add_key": 248,
        "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "timer_create": 222, "socket": 41, "socketpair": 53, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "process_madvise": 440, "pidfd_open": 434, "pidfd_getfd": 438,
        "pidfd_send_signal": 424, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
    "aarch64": {
        "clone": 220, "clone3": 435, "fcntl": 25, "prctl": 167, "seccomp": 277,
        "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "setxattrat": 463, "open_tree_attr": 467,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
        "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
        "memfd_create": 279, "memfd_secret": 447, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3,
        "io_getevents": 4, "io_pgetevents": 292, "inotify_init1": 26, "inotify_add_watch": 27,
        "fanotify_init": 262, "fanotify_mark": 263, "add_key": 217, "request_key": 218, "keyctl": 219,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "timer_create": 107, "socket": 198,
        "socketpair": 199, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "process_madvise": 440, "pidfd_open": 434, "pidfd_getfd": 438, "pidfd_send_signal": 424, "unshare": 97,
        "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = {"x86_64": 0x40000000}

# Classic BPF (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k) over struct seccomp_data:
# nr at offset 0, arch at 4, the low 32 bits of argument i at 16 + 8 * i (little-endian).
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _EAGAIN, _ENOSYS = _ERRNO | 1, _ERRNO | 11, _ERRNO | 38


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.lru_cache(maxsize=None)
def seccomp_program(machine: str | None = None, *, start_stage: bool = False) -> bytes | None:
    """The filter for this machine's architecture (None for one without a table): another
    architecture's calls kill the process (x32 calls fail); fork, vfork and clone fail with
    EAGAIN, threads included, so the sample is one task; clone3, whose flags a filter cannot
    read, fails with ENOSYS so that the C library falls back to clone; every syscall of `DENIED`
    and every operation of `DENIED_OPERATIONS` fails with EPERM; syscalls from
    `FIRST_UNREVIEWED` on fail with ENOSYS; everything else is allowed.

    `start_stage`: the copy bubblewrap loads, which lets the start stage make what `START_STAGE`
    names; the complete filter it then loads refuses them."""
    machine = machine or os.uname().machine
    numbers = SYSCALL_NUMBERS.get(machine)
    if numbers is None:
        return None
    setup = set(START_STAGE["syscalls"]) | {"unshare"} if start_stage else set()
    body = [_insn(_LD_W_ABS, 4), _insn(_JEQ, _AUDIT_ARCH[machine], 1, 0), _insn(_RET, _KILL_PROCESS),
            _insn(_LD_W_ABS, 0)]
    if machine in _X32_BIT:
        body += [_insn(_JGE, _X32_BIT[machine], 0, 1), _insn(_RET, _EPERM)]
    body += [_insn(_JGE, FIRST_UNREVIEWED, 0, 1), _insn(_RET, _ENOSYS)]
    refusals = [("clone3", _ENOSYS)] + [(name, _EAGAIN) for name in ("clone", "fork", "vfork")]
    refusals += [(name, _EPERM) for _, names in DENIED.values() for name in names if name not in setup]
    for name, errno in refusals:
        if name in numbers:
            body += [_insn(_JEQ, numbers[name], 0, 1), _insn(_RET, errno)]
    by_syscall: dict[tuple[str, int], set[int]] = {}
    for _, syscall, argument, operations in DENIED_OPERATIONS.values():
        allowed = START_STAGE.get(syscall, ()) if start_stage else ()
        by_syscall.setdefault((syscall, argument), set()).update(
            value for name, value in operations.items() if name not in allowed)
    for (syscall, argument), values in sorted(by_syscall.items()):
        # Past the syscall's number only when it is this one; then the argument decides alone.
        checks = [_insn(_LD_W_ABS, 16 + 8 * argument)]
        for value in sorted(values):
            checks += [_insn(_JEQ, value, 0, 1), _insn(_RET, _EPERM)]
        checks.append(_insn(_RET, _ALLOW))
        body += [_insn(_JEQ, numbers[syscall], 0, len(checks))] + checks
    if start_stage:
        body += [_insn(_JEQ, numbers["unshare"], 0, 4), _insn(_LD_W_ABS, 16),
                 _insn(_JEQ, START_STAGE["unshare"], 0, 1), _insn(_RET, _ALLOW), _insn(_RET, _EPERM)]
    body.append(_insn(_RET, _ALLOW))
    return b"".join(body)
