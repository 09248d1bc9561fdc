"""A crash in an engine's native code fails its cell, never the run or the test session:
native engines decode in a process of their own (`worker.isolated`), and a process killed by
a signal is reported naming the signal, the engine, its build and the CPU, with nothing
written. On an AMX CPU, llama.cpp's repacked weights are such a crash (llama.cpp#20824),
which is why the engine turns repacking off."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SMOLLM2, tiny_study, write_yaml
from tokenflip.core.cpu_flags import cpu_flags, cpu_model, kernel_flags
from tokenflip.run import engines
from tokenflip.run.engines.worker import EngineCrash, WorkerError, isolated
from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells


def _double(x):
    return 2 * x


def _segfault(*_):
    ctypes.string_at(0)  # reads address 0: SIGSEGV in native code


def _refuse(what):
    raise ValueError(f"bad {what}")


def _exit(code):
    sys.exit(code)


class _TwoArgumentError(Exception):
    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")


def _raise_unloadable():
    raise _TwoArgumentError("x", "y")  # pickles, but cannot be made again from its args


def _unpicklable_result():
    return lambda: None


def test_the_child_hands_back_its_result():
    assert isolated(_double, (21,), what="engine 'x'") == 42


def test_an_error_in_the_child_is_raised_here_as_itself():
    with pytest.raises(ValueError, match="^bad input$"):
        isolated(_refuse, ("input",), what="engine 'x'")


def test_a_child_that_exits_without_a_result_names_its_exit_code():
    with pytest.raises(WorkerError, match=r"engine 'x': the engine's process ended with exit code 3 and handed back "
                                          r"nothing"):
        isolated(_exit, (3,), what="engine 'x'")


def test_what_cannot_be_handed_back_fails_with_its_reason_and_leaves_nothing_behind(capfd):
    with pytest.raises(WorkerError, match=r"engine 'x': the engine's process failed and its error could not be read "
                                          r"back \(TypeError: .*\); its traceback is in this job's log above"):
        isolated(_raise_unloadable, (), what="engine 'x'")
    assert "_TwoArgumentError: x: y" in capfd.readouterr().err  # the child's traceback, in the log
    with pytest.raises(WorkerError, match=r"^the engine's result could not be handed back \((PicklingError|"
                                          r"AttributeError): "):
        isolated(_unpicklable_result, (), what="engine 'x'")


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            out |= {int(child)} | _descendants(int(child))
    return out


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_engine_process_ends_with_its_job():
    """A job killed outright (SIGKILL: its scheduler gone, a cluster's time limit) takes its
    engine's process with it, instead of leaving it to burn its cores to the end."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from tokenflip.run.engines.worker import isolated; "
            "isolated(time.sleep, (300,), what='x')")
    job = subprocess.Popen([sys.executable, "-c", code, str(REPO / "src")])
    engine = set()
    deadline = time.monotonic() + 60
    while not engine and time.monotonic() < deadline:
        time.sleep(0.5)
        engine = {pid for pid in _descendants(job.pid)
                  if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="ignore")}
    assert engine, "the engine's process did not start"
    time.sleep(2)  # past its start: the parent-death signal is set
    job.kill()
    job.wait()
    deadline = time.monotonic() + 30
    while not all(map(_gone, engine)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_gone, engine))


def test_a_segfault_is_a_crash_naming_the_signal_the_engine_its_build_and_the_cpu():
    with pytest.raises(EngineCrash) as err:
        isolated(_segfault, (), what="engine 'x'", build=lambda: "x 1.0, AVX2 = 1")
    message = str(err.value)
    assert message.startswith("engine 'x': the engine's process was killed by signal SIGSEGV (11);")
    assert "engine build: x 1.0, AVX2 = 1;" in message
    assert f"CPU: {cpu_model()} [{' '.join(kernel_flags())}]" in message
    assert "Nothing was written" in message


def test_a_build_that_cannot_describe_itself_still_leaves_the_crash_named():
    def broken():
        raise OSError("no library")

    with pytest.raises(EngineCrash, match=r"SIGSEGV .*engine build: not readable \(OSError: no library\)"):
        isolated(_segfault, (), what="engine 'x'", build=broken)


def _crashing_decode(job, bench, model_dir, progress):
    return isolated(_segfault, (), what="engine 'transformers'", build=lambda: "a build")


def test_a_cell_whose_engine_segfaults_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """`tokenflip run-cell` around a crashed engine: one line naming the crash, exit 1, no
    cell file, and this test's own process lives on to check it."""
    from tokenflip.cli import main as cli

    study = tiny_study()
    study.update(models={"m": {"source": "random", "architecture": "llama", "seed": 0}},
                 benchmarks={"a": {"kind": "arithmetic", "n": 2, "max_new_tokens": 4}},
                 grids=[{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}], comparisons=[], probes={})
    config_path = write_yaml(tmp_path / "study.yaml", study)
    (cell,) = expand_cells(cfg.validate(study, check_data=False))
    out = tmp_path / "cells" / "c.parquet"
    monkeypatch.setattr(engines.REGISTRY["transformers"], "decode", _crashing_decode)
    code = cli.main(["run-cell", "--config", str(config_path), "--cell", cell.id, "--out", str(out),
                     "--models-dir", str(tmp_path / "models"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("tokenflip run-cell: error: engine 'transformers': the engine's process was killed by "
                              "signal SIGSEGV (11); engine build: a build; CPU: ")
    assert "Traceback" not in "\n".join(err)
    assert not out.exists() and not out.parent.exists()


llama_cpp_missing = engines.unavailable("llama.cpp") is not None


def _evaluate_with_repack(path: str, repack: bool) -> int:
    """Two tokens of the default GGUF through llama.cpp, its weights repacked or not: the
    number of vocabulary entries in the logits, if the process survives."""
    import llama_cpp

    from tokenflip.run.engines.llama_cpp_gguf import load

    if repack:
        llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
        assert llm.model_params.use_extra_bufts
    else:
        llm = load(path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
    llm.eval([1, 2])
    return llm.n_vocab()


@pytest.mark.skipif(llama_cpp_missing, reason="llama-cpp-python is not installed")
@pytest.mark.skipif(not {"amx_tile", "amx_int8"} <= cpu_flags(), reason="the repacking crash is AMX's")
def test_on_an_amx_cpu_repacked_weights_crash_llama_cpp_and_the_engine_s_loading_does_not():
    """The reason the engine turns repacking off, on this CPU: llama-cpp-python's defaults
    segfault on an evaluation of more than one token; the engine's loading runs it."""
    from tokenflip.run.engines.llama_cpp_gguf import build_flags, gguf_path

    path = str(gguf_path(SMOLLM2))
    with pytest.raises(EngineCrash, match=r"killed by signal SIGSEGV .*engine build: llama-cpp-python 0\.3\.36, .*AMX"):
        isolated(_evaluate_with_repack, (path, True), what="engine 'llama.cpp'", build=build_flags)
    assert isolated(_evaluate_with_repack, (path, False), what="engine 'llama.cpp'") == 49152


@pytest.mark.skipif(llama_cpp_missing, reason="llama-cpp-python is not installed")
def test_llama_cpp_s_server_is_started_without_weight_repacking():
    """`tokenflip serve llama.cpp`, `audit` and the tests start llama-cpp-python's server
    through tokenflip's wrapper, which turns repacking off before any model loads."""
    from tokenflip.run.engines.local_servers import llama_cpp_command

    command = llama_cpp_command("m.gguf", 8000, "m")
    assert command[:3] == [sys.executable, "-m", "tokenflip.run.engines.llama_cpp_server"]
    probe = ("import llama_cpp.llama_cpp as lib, runpy, sys; sys.argv = ['x', '--help'];"
             "from tokenflip.run.engines import llama_cpp_server as s; s.disable_weight_repack();"
             "print(lib.llama_model_default_params().use_extra_bufts)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
