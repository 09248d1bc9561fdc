"""An in-process convenience layer for the candidate process where the operating system cannot
isolate it (`unsafe_execution`): disables process and thread creation, signals, sockets and writes outside
the working directory at the level of the builtin modules. Candidate code can undo it (for
instance by re-importing modules), so it is never the boundary. Standard library only."""

import _signal
import os
import sys


def install(root):
    """Disable process creation, signals to other processes, sockets and writes outside `root`,
    at the level of the builtin modules, so that os, subprocess, shutil, socket, pty and
    multiprocessing are all covered without importing them here."""
    import _posixsubprocess
    import _socket
    import _thread
    import builtins
    import faulthandler
    import io
    import posix

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
    # No threads either, as under the seccomp filter, so that a verdict does not depend on the mode.
    _thread.start_new_thread = _thread.start_new = deny("threads")
    loaded_threading = sys.modules.get("threading")
    if loaded_threading is not None:
        loaded_threading._start_new_thread = _thread.start_new_thread
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
