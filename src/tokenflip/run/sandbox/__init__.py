"""Running untrusted code and returning a verdict that the code cannot forge.

What it guarantees (each one tested by an attack in tests/run/test_sandbox.py; `GUARANTEES`
states them, and `available_layers` says which this machine provides):
- The verdict is decided by a separate, trusted test process. The candidate process only
  answers calls on the model's code, and only plain data crosses between them (`_wire`):
  a forged success marker, an always-equal object or a patched test cannot pass.
- Each process runs in a bubblewrap sandbox (`bwrap`): a read-only view of the interpreter
  and its standard library only, a private tmpfs bounded in bytes and inodes (mounted by the
  start stage, `_confine`), fresh user, PID, network, IPC and UTS namespaces, no
  capabilities, an unprivileged uid, the seccomp filter of `seccomp` (no processes or
  threads, no kernel objects that hold memory outside the limits, no sockets by any route),
  and death with the scorer.
- Hard limits on the whole sample: CPU time, wall time, memory, output, open files, queued
  signals; every other kind of kernel object is refused or bounded (docs/sandbox.md).
- Where the machine cannot provide a layer, `Layers.missing` names it, and code benchmarks
  refuse to score unless told `unsafe_execution`.

`contract` states these as data (guarantees, limits, layers, results); `execution` runs the
two processes; `bwrap` builds the sandbox; `_confine` starts each process in it; `seccomp` is
its filter. The code benchmarks (`tokenflip.run.benchmarks.humaneval`,
`mbpp`) call `run_sample` with a `TestProgram`; nothing here knows about benchmarks.
"""

from tokenflip.run.sandbox.execution import (
    GUARANTEES,
    TAG_VARIABLE,
    ExecutionResult,
    Layers,
    Limits,
    TestProgram,
    available_layers,
    run_program,
    run_sample,
    sandbox_description,
    tagged_processes,
)

__all__ = ["GUARANTEES", "TAG_VARIABLE", "ExecutionResult", "Layers", "Limits", "TestProgram", "available_layers",
           "run_program", "run_sample", "sandbox_description", "tagged_processes"]
