"""The start stage of every sandboxed process, run before any other code in it: it mounts the
process's scratch (a tmpfs bounded in bytes and in inodes, which bubblewrap cannot do: its
`--size` sets no `nr_inodes`), gives up the capabilities it needed for that, loads the
complete seccomp filter, and only then runs the helper it was given.

bubblewrap starts it with CAP_SYS_ADMIN and CAP_SETPCAP, in a user namespace nested in the
sandbox's (`--disable-userns`), which does not own the sandbox's mount namespace: so it first
makes a mount namespace of its own, where the mount is allowed.

Run as `python -I -B _confine.py SPEC_JSON SCRIPT ARGS...` (or `-c CODE ARGS...`); standard
library only. Any step that fails ends the process (status 125) before SCRIPT runs."""

import ctypes
import json
import os
import sys
import types

CLONE_NEWNS, MS_NOSUID, MS_NODEV = 0x00020000, 0x2, 0x4
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 23, 24, 38, 22, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER, CAP_VERSION_3 = 4, 2, 0x20080522
CAP_SETPCAP, CAP_SYS_ADMIN = 8, 21


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class StartError(Exception):
    """A step of the start stage failed; the process must not go on."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise StartError(f"{what} failed: {os.strerror(errno)} (errno {errno})")


def mount_scratch(libc, path, size_bytes, inodes):
    """A tmpfs on `path` that holds at most `size_bytes` of data and `inodes` inodes (every
    file, directory, symlink, hard link and, since Linux 6.6, user extended attribute takes
    from the latter), in a mount namespace of this process's own."""
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS) for the scratch mount")
    options = f"size={int(size_bytes)},nr_inodes={int(inodes)},mode=0700".encode()
    _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
           f"mounting the scratch tmpfs on {path} ({options.decode()})")
    os.chdir(path)
    found = os.statvfs(path)
    if found.f_files != inodes:
        raise StartError(f"the scratch on {path} has {found.f_files} inodes, not {inodes}")


def drop_capabilities(libc):
    """No capability left, in any set, and none that an exec could bring back."""
    known = 0
    while libc.prctl(PR_CAPBSET_READ, known, 0, 0, 0) >= 0:
        known += 1
    for cap in [c for c in range(known) if c != CAP_SETPCAP] + [CAP_SETPCAP]:  # the one dropping needs, last
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} from the bounding set")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing the ambient capabilities")
    header, data = _CapHeader(CAP_VERSION_3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset to no capabilities")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(libc.capget(ctypes.byref(header), data), "capget")
    left = [(d.effective, d.permitted, d.inheritable) for d in data]
    if any(any(sets) for sets in left) or libc.prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) != 0:
        raise StartError(f"capabilities remain after dropping them: {left}")


def load_filter(libc, program):
    """Stack the complete seccomp filter on bubblewrap's copy; from here on the start stage's
    own calls (mount, unshare, seccomp) are refused as well."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
           "loading the complete seccomp filter")


def confine(spec):
    """Everything the start stage does, in order; raises StartError if any step fails. The
    spec's `seccomp` is the complete filter (hex), built by the scorer, or None."""
    libc = _libc()
    mount_scratch(libc, spec["workdir"], spec["workdir_bytes"], spec["workdir_inodes"])
    drop_capabilities(libc)
    if spec["seccomp"] is not None:
        load_filter(libc, bytes.fromhex(spec["seccomp"]))


def main():
    spec, target = json.loads(sys.argv[1]), sys.argv[2:]
    try:
        confine(spec)
        if target[0] == "-c":
            name, source = "<string>", target[1]
            sys.argv = ["-c", *target[2:]]
        else:
            name = target[0]
            with open(name, encoding="utf-8") as f:
                source = f.read()
            sys.argv = target
        code = compile(source, name, "exec")
    except (StartError, OSError, KeyError, ValueError, IndexError, SyntaxError) as e:
        os.write(2, f"tokenflip sandbox start stage: {e}\n".encode())
        os._exit(125)
    # The script runs as __main__, as `python SCRIPT` would run it (runpy.run_path does the same,
    # for a few milliseconds more per process).
    main_module = types.ModuleType("__main__")
    if name != "<string>":
        main_module.__file__ = name
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    exec(code, main_module.__dict__)


if __name__ == "__main__":
    main()
