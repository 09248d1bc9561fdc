"""The decode loop keeps its per-step record on the device: the stored values are bitwise
those of the record it replaced (each statistic copied to the host every step), the host
waits for the device once per step, and its work per step does not grow with the batch."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from tokenflip.models.prepare import load_prepared
from tokenflip.run.decode import decode, left_pad
from tokenflip.run.heads import GatedFP32Head
from tokenflip.run.step_record import Generation, StepRecord, record_step

_spec = importlib.util.spec_from_file_location("perf_syncs", REPO / "perf" / "_syncs.py")
perf_syncs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_syncs)

NO_EOS = [-1]
# Left-padded in every batch (the rows differ in length), so that all take the same path.
PROMPTS = [[5, 17, 230, 41, 99, 7, 301], [12, 8, 77], [64, 3, 150, 9, 22], [40, 41, 42, 43]]


def _record_as_before(generations, logits, chosen, unfinished, k, fired):
    """The record as cells wrote it before it stayed on the device (every statistic copied
    to the host each step, then a loop over the rows): what must be stored, bit for bit."""
    top = torch.topk(logits, k=min(k, logits.shape[-1]), dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits - lse[:, None]
    stats = {"top_ids": top.indices, "top_logits": top.values, "margin": top.values[:, 0] - top.values[:, 1],
             "logsumexp": lse, "entropy": -(logp.exp() * logp).sum(dim=-1)}
    stats = {name: t.cpu() for name, t in stats.items()}
    chosen = chosen.cpu().tolist()
    active = unfinished.cpu().tolist()
    fired = fired.cpu().tolist() if fired is not None else [False] * len(generations)
    for row, gen in enumerate(generations):
        if not active[row]:
            continue
        gen.token_ids.append(int(chosen[row]))
        gen.top_ids.append(stats["top_ids"][row].numpy().astype(np.int32))
        gen.top_logits.append(stats["top_logits"][row].numpy().astype(np.float32))
        gen.margin.append(float(stats["margin"][row]))
        gen.logsumexp.append(float(stats["logsumexp"][row]))
        gen.entropy.append(float(stats["entropy"][row]))
        gen.intervened.append(bool(fired[row]))


def _assert_bitwise_equal(ours: Generation, reference: Generation) -> None:
    assert ours.token_ids == reference.token_ids
    assert all(type(t) is int for t in ours.token_ids)
    for name in ("top_ids", "top_logits"):
        a, b = getattr(ours, name), getattr(reference, name)
        assert len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape for x, y in zip(a, b)), name
        assert np.stack(a).tobytes() == np.stack(b).tobytes(), name
    for name in ("margin", "logsumexp", "entropy"):
        a, b = getattr(ours, name), getattr(reference, name)
        assert all(type(x) is float for x in a), name
        assert np.asarray(a, dtype=np.float64).tobytes() == np.asarray(b, dtype=np.float64).tobytes(), name
    assert ours.intervened == reference.intervened and all(type(x) is bool for x in ours.intervened)


@pytest.mark.parametrize("gated", [False, True])
def test_record_is_bitwise_the_per_step_record(prepared_models, monkeypatch, gated):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    if gated:  # C's gate fires on some rows and steps (bf16 logits of a random model tie often)
        GatedFP32Head.wrap(model, tau=1e-2)
    ids, mask = left_pad(PROMPTS, tokenizer.pad_token_id)
    common = dict(max_new_tokens=12, use_cache=True, pad_token_id=tokenizer.pad_token_id, record_top_k=5)
    free = decode(model, ids, mask, eos_token_ids=NO_EOS, **common)
    eos = [free.generations[0].token_ids[3]]  # ends row 0 by step 3, the others when they meet it
    before = [Generation() for _ in PROMPTS]
    one_step_at_a_time = [Generation() for _ in PROMPTS]
    add = StepRecord.add

    def add_and_record_as_before(self, logits, chosen, unfinished, fired):
        if self.capacity > 1:  # the loop's record (record_step's own is one step long)
            _record_as_before(before, logits, chosen, unfinished, self.k, fired)
            record_step(one_step_at_a_time, logits, chosen, unfinished, self.k, fired)
        add(self, logits, chosen, unfinished, fired)

    monkeypatch.setattr(StepRecord, "add", add_and_record_as_before)
    now = decode(model, ids, mask, eos_token_ids=eos, **common)
    lengths = [len(g.token_ids) for g in now.generations]
    assert lengths[0] <= 4 and max(lengths) > lengths[0]  # rows end at different steps
    fired = [f for g in now.generations for f in g.intervened]
    assert (0 < sum(fired) < len(fired)) if gated else not any(fired)
    for ours, reference, stepped in zip(now.generations, before, one_step_at_a_time):
        _assert_bitwise_equal(ours, reference)
        _assert_bitwise_equal(stepped, reference)
        assert ours.finish_reason == ("eos" if ours.token_ids[-1] in eos else "length")
        assert ours.finish_reason == "eos" or len(ours.token_ids) == common["max_new_tokens"]


def _syncs_outside_forward(model, ids, mask, pad, steps: int) -> int:
    with perf_syncs.HostSyncs(model) as syncs:
        decode(model, ids, mask, max_new_tokens=steps, use_cache=True, eos_token_ids=NO_EOS, pad_token_id=pad)
    return syncs.outside


def test_the_host_waits_once_per_step(prepared_models):
    """Outside the forward pass: one conversion to the host per step (whether any row still
    runs), and a fixed few per batch (the mask check, the record's one transfer)."""
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    ids, mask = left_pad(PROMPTS, tokenizer.pad_token_id)
    pad = tokenizer.pad_token_id
    short, long_ = (_syncs_outside_forward(model, ids, mask, pad, steps) for steps in (4, 8))
    assert long_ - short == 4
    assert short - 4 <= 3
    # the counter sees conversions: the record as it was, alone, makes one per statistic and more
    with perf_syncs.HostSyncs(model) as syncs:
        _record_as_before([Generation() for _ in PROMPTS], torch.randn(4, 50), torch.zeros(4, dtype=torch.long),
                          torch.ones(4, dtype=torch.bool), 3, None)
    assert syncs.outside >= 8 and syncs.inside == 0


def _python_calls_outside_forward(model, ids, mask, pad, steps: int) -> int:
    calls, depth = [0], [0]

    def count(frame, event, arg):
        if event in ("call", "c_call") and not depth[0]:
            calls[0] += 1

    handles = [model.register_forward_pre_hook(lambda *a: depth.__setitem__(0, depth[0] + 1)),
               model.register_forward_hook(lambda *a: depth.__setitem__(0, depth[0] - 1))]
    sys.setprofile(count)
    try:
        decode(model, ids, mask, max_new_tokens=steps, use_cache=True, eos_token_ids=NO_EOS, pad_token_id=pad)
    finally:
        sys.setprofile(None)
        for handle in handles:
            handle.remove()
    return calls[0]


def test_host_work_per_step_does_not_grow_with_the_batch(prepared_models):
    """Python calls per step outside the forward pass (the difference between 8 and 4 steps,
    so that the once-per-batch work cancels) are the same for 2 rows and for 4."""
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    pad = tokenizer.pad_token_id
    # An untimed first run: the first decode of a process imports what transformers loads
    # lazily, calls that are no step's.
    _python_calls_outside_forward(model, *left_pad(PROMPTS[:2], pad), pad, 4)
    per_step = {}
    for rows in (2, 4):
        ids, mask = left_pad(PROMPTS[:rows], pad)
        short, long_ = (_python_calls_outside_forward(model, ids, mask, pad, steps) for steps in (4, 8))
        per_step[rows] = (long_ - short) / 4
    assert per_step[2] == per_step[4] > 0


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_the_records_launches_per_step_eager_and_through_its_graph(batch):
    """The operations the record issues a step (each a kernel launch or more on CUDA; the
    dispatcher sees the same ones on a CPU build): 10 eagerly, at every batch size. Through
    its CUDA graph the host issues 4 (the step's inputs copied in) and one replay; the
    graph's body, run here without a capture, writes the eager record's values bit for bit
    into the step's row and advances the step on the device."""
    from collections import Counter

    gen = torch.Generator().manual_seed(batch)
    logits = [torch.randn(batch, 300, generator=gen) for _ in range(3)]
    chosen = torch.randint(0, 300, (batch,), generator=gen)
    unfinished = torch.rand(batch, generator=gen) > 0.3
    fired = torch.rand(batch, generator=gen) > 0.5
    eager, graphed = StepRecord(batch, 6, 5), StepRecord(batch, 6, 5)
    before = Counter(StepRecord.graph_use)
    with torch.inference_mode():
        eager.add(logits[0], chosen, unfinished, None)
        ops = perf_syncs.device_ops(lambda: eager.add(logits[1], chosen, unfinished, fired))
        assert ops == {"topk": 1, "sub": 2, "logsumexp": 1, "exp": 1, "mul_": 1, "sum": 1, "neg_": 1, "copy_": 3}
        assert sum(perf_syncs.device_ops(lambda: eager.add(logits[2], chosen, unfinished, None)).values()) == 10
        graphed.add(logits[0], chosen, unfinished, None)
        graphed._graph_inputs(logits[1], chosen, unfinished)
        assert perf_syncs.device_ops(lambda: graphed._feed(logits[1], chosen, unfinished, fired)) == {"copy_": 4}
        assert perf_syncs.device_ops(lambda: graphed._feed(logits[2], chosen, unfinished, None)) == \
            {"copy_": 3, "zero_": 1}
        graphed._feed(logits[1], chosen, unfinished, fired)
        graphed._graph_body()
        graphed._feed(logits[2], chosen, unfinished, None)
        graphed._graph_body()
    assert int(graphed.inputs["step"]) == 3
    for name, buffer in eager.buffers.items():
        assert buffer[:3].numpy().tobytes() == graphed.buffers[name][:3].numpy().tobytes(), name
    assert eager.graph is None and eager.graph_note == "eager: not CUDA"
    assert StepRecord.graph_use - before == Counter({"eager: not CUDA": 2})
