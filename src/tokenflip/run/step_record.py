"""The decode loop's per-step record: each step's chosen token, top-k ids and logits, the
top-1 minus top-2 margin, logsumexp and entropy of its fp32 logits, and whether an
intervention fired, kept on the logits' device until the batch ends (one transfer)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Generation:
    """One prompt's completion with its per-step record (one entry per generated token)."""

    token_ids: list[int] = field(default_factory=list)
    top_ids: list[np.ndarray] = field(default_factory=list)
    top_logits: list[np.ndarray] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    logsumexp: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    intervened: list[bool] = field(default_factory=list)
    finish_reason: str = "length"


def _statistics_buffers(shape: tuple[int, ...], k: int, device) -> dict[str, torch.Tensor]:
    """Empty buffers for `step_statistics`: top-k ids (int64, as topk gives them) and logits
    of shape [*shape, k], the other statistics [*shape]."""
    return {"top_ids": torch.empty((*shape, k), dtype=torch.long, device=device),
            "top_logits": torch.empty((*shape, k), dtype=torch.float32, device=device),
            **{name: torch.empty(shape, dtype=torch.float32, device=device)
               for name in ("margin", "logsumexp", "entropy")}}


def step_statistics(logits: torch.Tensor, k: int, out: dict[str, torch.Tensor] | None = None,
                    scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Top-k ids and logits, top-1 minus top-2 margin, logsumexp and entropy of fp32 logits.

    With `out` (one step's buffers) and `scratch` (two [B, V] fp32 tensors) it writes into
    them and allocates no output of its own (logsumexp's temporaries aside), so a loop keeps
    every step on the device; the kernels and so the values are the same either way."""
    batch, vocab = logits.shape
    out = _statistics_buffers((batch,), min(k, vocab), logits.device) if out is None else out
    logp_buffer, p_buffer = scratch if scratch is not None else (None, None)
    torch.topk(logits, k=out["top_ids"].shape[-1], dim=-1, out=(out["top_logits"], out["top_ids"]))
    torch.sub(out["top_logits"][:, 0], out["top_logits"][:, 1], out=out["margin"])
    lse = torch.logsumexp(logits, dim=-1, out=out["logsumexp"])
    logp = torch.sub(logits, lse[:, None], out=logp_buffer)
    # entropy = -sum(exp(logp) * logp)
    torch.sum(torch.exp(logp, out=p_buffer).mul_(logp), dim=-1, out=out["entropy"]).neg_()
    return out


# Why a row ended, kept on the device as an index into this tuple while the batch runs.
FINISH_REASONS = ("length", "eos", "stop")
_EOS, _STOP = FINISH_REASONS.index("eos"), FINISH_REASONS.index("stop")


class StepRecord:
    """One batch's per-step record, kept on the logits' device in buffers sized for every
    step: a step writes its statistics there without waiting for the device, and the whole
    record moves to the host once, after the last step, in one transfer. The host's work
    per step does not grow with the batch size.

    On CUDA the record's kernels (a dozen launches a step) are captured once per batch, at
    its second step, into one CUDA graph: each later step copies its inputs into the graph's
    own tensors and replays it (five launches). A graph replays the very kernels captured,
    so the values are those of the eager record; the first replay is checked against them
    bit for bit, and a graph that cannot be captured, or differs, is dropped for the eager
    record (`graph_use` counts each batch's way, with the reason)."""

    # TOKENFLIP_RECORD_GRAPH=0: the eager record on CUDA too (what a comparison of the two runs).
    GRAPH = os.environ.get("TOKENFLIP_RECORD_GRAPH", "1") != "0"
    graph_use: Counter = Counter()

    def __init__(self, batch: int, steps: int, k: int):
        self.batch, self.capacity, self.k = batch, steps, k
        self.steps = 0
        self.buffers: dict[str, torch.Tensor] = {}
        self.graph = None
        self.graph_note: str | None = None

    def _allocate(self, logits: torch.Tensor) -> None:
        shape, device = (self.capacity, self.batch), logits.device
        # 8-byte values first, so that each one's host view is aligned
        self.buffers = {"chosen": torch.empty(shape, dtype=torch.long, device=device),
                        **_statistics_buffers(shape, min(self.k, logits.shape[-1]), device),
                        "active": torch.empty(shape, dtype=torch.bool, device=device),
                        "intervened": torch.zeros(shape, dtype=torch.bool, device=device)}
        self.scratch = (torch.empty_like(logits), torch.empty_like(logits))
        if device.type != "cuda":
            self.graph_note = "eager: not CUDA"
        elif not self.GRAPH:
            self.graph_note = "eager: TOKENFLIP_RECORD_GRAPH=0"
        elif self.capacity < 3:
            self.graph_note = "eager: fewer than 3 steps"
        if self.graph_note is not None:
            self.graph_use[self.graph_note] += 1

    def add(self, logits: torch.Tensor, chosen: torch.Tensor, unfinished: torch.Tensor,
            fired: torch.Tensor | None) -> None:
        """Record one step: fp32 logits [B, V], the chosen tokens, the rows still generating
        (only they keep the step), and the rows an intervention fired on (None: none)."""
        if not self.buffers:
            self._allocate(logits)
        if self.steps >= self.capacity:  # on a graph, an overrun would be a device-side assert
            raise IndexError(f"step {self.steps} of a record sized for {self.capacity}")
        if self.graph is not None:
            self._feed(logits, chosen, unfinished, fired)
            self.graph.replay()
        elif self.steps == 1 and self.graph_note is None:  # the first step ran every kernel once
            self._capture(logits, chosen, unfinished, fired)
        else:
            self._eager(logits, chosen, unfinished, fired)
        self.steps += 1

    def _eager(self, logits, chosen, unfinished, fired) -> None:
        step = {name: buffer[self.steps] for name, buffer in self.buffers.items()}
        step_statistics(logits, self.k, out=step, scratch=self.scratch)
        step["chosen"].copy_(chosen)
        step["active"].copy_(unfinished)
        if fired is not None:
            step["intervened"].copy_(fired)

    def _feed(self, logits, chosen, unfinished, fired) -> None:
        """A step's inputs into the graph's own tensors: the host's only launches besides the replay."""
        given = self.inputs
        given["logits"].copy_(logits)
        given["chosen"].copy_(chosen)
        given["active"].copy_(unfinished)
        if fired is None:
            given["fired"].zero_()
        else:
            given["fired"].copy_(fired)

    def _graph_body(self) -> None:
        """The eager record's kernels, on the graph's inputs, into row `step` of each buffer."""
        given, now = self.inputs, self.current
        step_statistics(given["logits"], self.k, out=now, scratch=self.scratch)
        for name, source in (*now.items(), ("chosen", given["chosen"]), ("active", given["active"]),
                             ("intervened", given["fired"])):
            self.buffers[name].index_copy_(0, given["step"], source.unsqueeze(0))
        given["step"].add_(1)

    def _graph_inputs(self, logits, chosen, unfinished) -> None:
        """The graph's own tensors: its inputs, the step's statistics, and the step's index
        on the device (the graph advances it)."""
        device = logits.device
        self.inputs = {"logits": torch.empty_like(logits), "chosen": torch.empty_like(chosen),
                       "active": torch.empty_like(unfinished), "fired": torch.zeros_like(unfinished),
                       "step": torch.full((1,), self.steps, dtype=torch.long, device=device)}
        self.current = _statistics_buffers((self.batch,), self.buffers["top_ids"].shape[-1], device)

    def _capture(self, logits, chosen, unfinished, fired) -> None:
        """This step through a graph captured now and checked against the eager record, or,
        where it cannot be captured or differs, eagerly (and every later step too)."""
        self._graph_inputs(logits, chosen, unfinished)
        try:
            self._feed(logits, chosen, unfinished, fired)
            graph = _captured(self._graph_body, logits.device)
            # An empty graph (kernels run on another device's stream, say) must not pass for
            # one: the row and the step are reset, so only a replay that does the work fills them.
            for buffer in self.buffers.values():
                buffer[self.steps].fill_(-1 if buffer.dtype != torch.bool else True)
            self.inputs["step"].fill_(self.steps)
            graph.replay()
            row = {name: buffer[self.steps] for name, buffer in self.buffers.items()}
            alone = step_statistics(logits, self.k)
            alone.update(chosen=chosen, active=unfinished.to(torch.bool),
                         intervened=torch.zeros_like(row["intervened"]) if fired is None else fired.to(torch.bool))
            differs = [name for name, value in alone.items() if not _same_bits(row[name], value)]
            if int(self.inputs["step"]) != self.steps + 1:
                differs.append("the step it advances")
            if differs:
                raise ValueError(f"its first replay differs from the eager record in {differs}")
        except Exception as exc:  # noqa: BLE001 - the eager record is always right: said, then used
            self.graph_note = f"eager: the graph was dropped ({type(exc).__name__}: {' '.join(str(exc).split())})"
            self.graph_use[f"eager: the graph was dropped ({type(exc).__name__})"] += 1
            self._eager(logits, chosen, unfinished, fired)
            return
        self.graph, self.graph_note = graph, "graph"
        self.graph_use["graph"] += 1

    def append_to(self, generations: list[Generation], finish: torch.Tensor | None = None) -> None:
        """Move the record to the host (one transfer) and append each row's steps to its
        Generation; `finish` holds each row's index into FINISH_REASONS."""
        tensors = {name: buffer[:self.steps] for name, buffer in self.buffers.items()}
        if finish is not None:
            tensors["finish"] = finish
        host = _to_host(tensors)
        if self.steps:
            _append_steps(generations, host)
        for gen, reason in zip(generations, host.get("finish", ())):
            gen.finish_reason = FINISH_REASONS[reason]


_NUMPY_DTYPES = {torch.long: np.int64, torch.float32: np.float32, torch.bool: np.bool_, torch.int8: np.int8}


def _captured(body, device: torch.device):
    """`body`'s kernels captured into a CUDA graph on `device`, on a side stream of that
    device (capture is not allowed on the default stream), the current stream restored
    whatever happens. A capture that fails leaves the CUDA state in doubt: graphs are then
    off for the rest of the process (`StepRecord.GRAPH`)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)  # the inputs copied in on the current stream come first
        try:
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    body()
                finally:
                    graph.capture_end()
        except BaseException:
            StepRecord.GRAPH = False
            raise
        finally:
            torch.cuda.set_stream(current)
        current.wait_stream(side)
    return graph


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN included), of the same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        a, b = a.view(_BITS[a.element_size()]), b.view(_BITS[b.element_size()])
    return bool(torch.equal(a, b))


def _to_host(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Device tensors as host arrays, their bytes packed into one buffer so that they cross
    in one transfer."""
    packed = torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors.values()]).cpu().numpy()
    out, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        out[name] = packed[offset:offset + size].view(_NUMPY_DTYPES[t.dtype]).reshape(tuple(t.shape))
        offset += size
    return out


def _append_steps(generations: list[Generation], host: dict[str, np.ndarray]) -> None:
    """Append to each row the steps it was active in, from host arrays [steps, batch, ...]."""
    top_ids = host["top_ids"].astype(np.int32)
    for row, gen in enumerate(generations):
        kept = host["active"][:, row]
        gen.token_ids.extend(host["chosen"][kept, row].tolist())
        gen.top_ids.extend(top_ids[kept, row])
        gen.top_logits.extend(host["top_logits"][kept, row])
        gen.margin.extend(host["margin"][kept, row].tolist())
        gen.logsumexp.extend(host["logsumexp"][kept, row].tolist())
        gen.entropy.extend(host["entropy"][kept, row].tolist())
        gen.intervened.extend(host["intervened"][kept, row].tolist())


def record_step(generations: list[Generation], logits: torch.Tensor, chosen: torch.Tensor,
                unfinished: torch.Tensor, k: int, fired: torch.Tensor | None) -> None:
    """Append one step (chosen token, top-k, margin, logsumexp, entropy) to each unfinished
    row: the record of engines that step outside `decode`, written as `decode` writes it."""
    record = StepRecord(len(generations), 1, k)
    record.add(logits, chosen, unfinished, fired)
    record.append_to(generations)
