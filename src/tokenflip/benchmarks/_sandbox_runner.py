"""Trusted entry point of a sandboxed child: limit itself, disarm dangerous calls, run the
untrusted program, and print the parent's nonce only if the whole program ran without error.

Run as `python -I _sandbox_runner.py` with a JSON config on stdin; standard library only.
"""

import json
import os
import resource
import sys

import _signal


def _limit(limits):
    pairs = [
        (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"], limits["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if limits.get("nproc") is not None:
        pairs.append((resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]))
    for which, soft, hard in pairs:
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))
    _signal.alarm(limits["alarm_s"])


def _guard(root):
    """Disable process creation, signals to other processes, sockets and writes outside `root`,
    at the level of the builtin modules, so that os, subprocess, shutil, socket, pty and
    multiprocessing are all covered without importing them here."""
    import builtins
    import faulthandler
    import io
    import posix

    import _posixsubprocess
    import _socket

    faulthandler.disable()
    root = os.path.realpath(root)
    readlink, realpath, isabs, join = os.readlink, os.path.realpath, os.path.isabs, os.path.join
    dirname, basename, fspath = os.path.dirname, os.path.basename, os.fspath

    def deny(name):
        def blocked(*args, **kwargs):
            raise PermissionError(f"{name} is disabled in the sandbox")

        blocked.__name__ = name
        return blocked

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return False
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        if dir_fd is not None and not isabs(path):
            path = join(readlink(f"/proc/self/fd/{dir_fd}"), path)
        full = join(realpath(dirname(join(root, path)) or "/"), basename(path))
        return full == root or full.startswith(root + os.sep)

    def confined(name, original, nargs=1):
        def checked(*args, **kwargs):
            dir_fds = [kwargs.get(k) for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")]
            fd = next((d for d in dir_fds if d is not None), None)
            paths = list(args[:nargs])
            if len(paths) < nargs or not all(inside(p, fd) for p in paths):
                raise PermissionError(f"{name} outside the sandbox directory is disabled")
            return original(*args, **kwargs)

        checked.__name__ = name
        return checked

    spawning = [
        "system", "popen", "fork", "forkpty", "vfork", "posix_spawn", "posix_spawnp",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe", "fexecve",
        "kill", "killpg", "pidfd_open", "setsid", "setpgid", "setpgrp", "setuid", "setgid", "seteuid",
        "setegid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "chroot", "putenv",
        "unsetenv", "fchmod", "fchown", "lchmod", "mkfifo", "mknod", "plock", "sched_setaffinity",
    ]
    one_path = ["remove", "unlink", "rmdir", "removedirs", "truncate", "chmod", "chown", "lchown",
                "mkdir", "makedirs", "utime", "chdir", "chflags", "lchflags", "setxattr", "removexattr"]
    two_paths = ["rename", "renames", "replace", "link", "symlink"]
    for module in (os, posix):
        for name in spawning:
            if hasattr(module, name):
                setattr(module, name, deny(f"os.{name}"))
        for name in one_path:
            if hasattr(module, name):
                setattr(module, name, confined(f"os.{name}", getattr(module, name)))
        for name in two_paths:
            if hasattr(module, name):
                setattr(module, name, confined(f"os.{name}", getattr(module, name), 2))

    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    os_open = os.open

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & writing and not inside(path, kwargs.get("dir_fd")):
            raise PermissionError("writing outside the sandbox directory is disabled")
        return os_open(path, flags, *args, **kwargs)

    os.open = posix.open = guarded_os_open
    io_open = io.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and set(str(mode)) & set("wax+") and not inside(file):
            raise PermissionError("writing outside the sandbox directory is disabled")
        return io_open(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    _posixsubprocess.fork_exec = deny("subprocess")
    for name in ("alarm", "setitimer", "pthread_sigmask", "pthread_kill", "pidfd_send_signal", "sigwait"):
        if hasattr(_signal, name):
            setattr(_signal, name, deny(f"signal.{name}"))
    set_handler = _signal.signal

    def guarded_signal(signalnum, handler):
        if signalnum in (_signal.SIGALRM, _signal.SIGXCPU):
            raise PermissionError("changing SIGALRM/SIGXCPU handling is disabled in the sandbox")
        return set_handler(signalnum, handler)

    _signal.signal = guarded_signal

    class BlockedSocket:
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            raise PermissionError("sockets are disabled in the sandbox")

    _socket.socket = _socket.SocketType = BlockedSocket
    for name in ("socketpair", "fromfd", "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        if hasattr(_socket, name):
            setattr(_socket, name, deny(f"socket.{name}"))
    loaded_socket = sys.modules.get("socket")
    if loaded_socket is not None:
        for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server"):
            setattr(loaded_socket, name, BlockedSocket if name in ("socket", "SocketType") else deny(name))
    for name in ("ctypes", "_ctypes", "cffi", "_cffi_backend", "psutil", "resource", "_multiprocessing",
                 "ipdb", "pdb", "tkinter"):
        sys.modules[name] = None


def main():
    write, exit_now, stdout_fd = os.write, os._exit, sys.stdout.fileno()
    config = json.loads(sys.stdin.read())
    nonce = config.pop("nonce").encode()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)
    _limit(config["limits"])
    with open(config["program"], encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "solution.py", "exec")
        if config["guard"]:
            _guard(os.getcwd())
        del config
        exec(code, {"__name__": "solution", "__builtins__": __builtins__})
        sys.stdout.flush()
    except BaseException:
        import traceback

        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            exit_now(1)
    write(stdout_fd, b"\n" + nonce + b"\n")
    exit_now(0)


if __name__ == "__main__":
    main()
