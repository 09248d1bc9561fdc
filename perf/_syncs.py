"""Counting a loop's device-to-host synchronisations, inside and outside the model's forward,
and the operations (kernel launches on CUDA) a piece of it issues.

A synchronisation makes the host wait until the device has finished everything queued so
far, so a decode loop that has one per statistic per step leaves the device idle between
steps; on a CPU nothing waits, and the same calls are what would.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods that hand a value to the host: on an accelerator each waits for the device.
HOST_CONVERSIONS = frozenset({torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy,
                              torch.Tensor.__array__, torch.Tensor.__bool__, torch.Tensor.__int__,
                              torch.Tensor.__float__, torch.Tensor.__index__})


class HostSyncs:
    """Counts the synchronisations of the code run inside it (`with`): those inside
    `module`'s forward (`inside`) and the rest (`outside`).

    On every device: the calls of HOST_CONVERSIONS (a TorchFunctionMode sees each). On CUDA
    also what torch's CUDA sync debug mode reports (`cuda_inside`, `cuda_outside`), which
    includes operations that synchronise without a conversion (nonzero, boolean indexing)."""

    def __init__(self, module, device="cpu") -> None:
        self.module = module
        self.cuda = torch.device(device).type == "cuda"
        self.inside = self.outside = self.cuda_inside = self.cuda_outside = 0
        self._depth = 0
        self._warnings: list = []

    def _forward(self, change: int) -> None:
        self._take_cuda_warnings()
        self._depth += change

    def _count(self) -> None:
        if self._depth:
            self.inside += 1
        else:
            self.outside += 1

    def _take_cuda_warnings(self) -> None:
        n = sum("synchroniz" in str(w.message) for w in self._warnings)
        self._warnings.clear()
        if self._depth:
            self.cuda_inside += n
        else:
            self.cuda_outside += n

    def __enter__(self) -> "HostSyncs":
        counter = self

        class Conversions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in HOST_CONVERSIONS:
                    counter._count()
                return func(*args, **(kwargs or {}))

        self._stack = stack = contextlib.ExitStack()
        for handle in (self.module.register_forward_pre_hook(lambda *a: self._forward(+1)),
                       self.module.register_forward_hook(lambda *a: self._forward(-1))):
            stack.callback(handle.remove)
        self._warnings = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        stack.enter_context(Conversions())
        return self

    def __exit__(self, *exc) -> None:
        self._take_cuda_warnings()
        self._stack.close()


def device_ops(fn) -> Counter:
    """The ATen operations `fn` issues that do work on the tensors' device (views, aliases
    and allocations left out), by name: on CUDA each is at least one kernel launch, and the
    count is the same on a CPU build, where the dispatcher sees the same operations."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counted: Counter = Counter()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not (func.is_view or name in NO_WORK):
                counted[name] += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        fn()
    return counted


# Operations that give a tensor without computing anything on the device.
NO_WORK = frozenset({"empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh", "_to_copy_meta"})
