"""What a cell and a probe share at run time, so that a probe replays exactly what a cell
generated: prompt token ids, EOS and pad ids, seeding, threads and determinism."""

from __future__ import annotations

import os
import random

# torch is imported where it is used: the Snakefile reads the probe registry, which
# imports this module, and must not pay for torch.


def prompt_token_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template the messages into token ids, exactly once, with the generation prompt
    (by the server itself for a server's tokenizer)."""
    if hasattr(tokenizer, "chat_ids"):
        return tokenizer.chat_ids(messages)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class PromptFormatError(ValueError):
    """A benchmark's prompt format cannot be used with a model's tokenizer."""


def encode_prompt(tokenizer, bench, item) -> list[int]:
    """The token ids of one item's prompt in the benchmark's prompt style: through the
    tokenizer's chat template (`format: chat`; the system turn dropped when
    `system_prompt: false`), or as plain text with the tokenizer's own special tokens
    (`format: bare`, what base checkpoints expect)."""
    style = bench.prompt_style
    if style["format"] == "bare":
        return tokenizer(bench.bare_text(item))["input_ids"]
    if not getattr(tokenizer, "chat_template", None):
        raise PromptFormatError(f"benchmark {bench.name!r}: format 'chat', but the tokenizer has no chat template "
                                f"(a base checkpoint?); use format: bare")
    try:
        return prompt_token_ids(tokenizer, bench.chat_messages(item))
    except Exception as exc:  # jinja2 raises what the template raises (e.g. no system role)
        hint = "; try system_prompt: false" if style["system_prompt"] and "system" in str(exc).lower() else ""
        raise PromptFormatError(f"benchmark {bench.name!r}: the chat template refuses the prompt of {item.id!r} "
                                f"({type(exc).__name__}: {exc}){hint}") from None


def check_prompts(tokenizer, bench, max_new_tokens: int | None = None, context: int | None = None) -> dict:
    """Encode every item's prompt once (no model needed): what `check-prompts` runs per
    model and benchmark before any generation job, so that a prompt format the tokenizer
    cannot take, or a prompt and generation the model's `context` cannot hold, fails in
    seconds, not on a GPU."""

    import hashlib

    lengths, digest = [], hashlib.sha256()
    if hasattr(tokenizer, "chat_ids") and not tokenizer.chat_template and bench.prompt_style["format"] == "chat":
        # A server that renders its chat template only for its own chat API: an endpoint's
        # `api: chat` cells send the messages, an `api: completions` cell is refused before it.
        return {"benchmark": bench.name, "prompt_style": dict(bench.prompt_style), "prompts": len(bench.items()),
                "min_tokens": None, "max_tokens": None, "prompt_ids_sha256": None,
                "prompt_ids": "rendered by the server (its chat API)"}
    for item in bench.items():
        ids = encode_prompt(tokenizer, bench, item)
        lengths.append(len(ids))
        digest.update(item.id.encode() + b"\0" + ",".join(map(str, ids)).encode() + b"\n")
    problem = context_problem(f"benchmark {bench.name!r}", max(lengths), max_new_tokens or 0, context)
    if problem:
        raise PromptFormatError(problem)
    return {"benchmark": bench.name, "prompt_style": dict(bench.prompt_style), "prompts": len(lengths),
            "min_tokens": min(lengths), "max_tokens": max(lengths), "prompt_ids_sha256": digest.hexdigest()}


def context_problem(where: str, longest_prompt: int | None, max_new_tokens: int, context: int | None) -> str | None:
    """Why the longest prompt and the generation after it do not fit in the model's context
    (`longest_prompt` None: the prompts are not encoded yet, and even one token must fit)."""
    why = "(max_position_embeddings; a static cache and llama.cpp's n_ctx are sized prompt + max_new_tokens)"
    if context is None or (longest_prompt or 1) + max_new_tokens <= context:
        return None
    if longest_prompt is None:
        return (f"{where}: max_new_tokens {max_new_tokens} leaves no position for a prompt in the model's context of "
                f"{context} {why}")
    return (f"{where}: the longest prompt ({longest_prompt} tokens) and max_new_tokens {max_new_tokens} need "
            f"{longest_prompt + max_new_tokens} positions, more than the model's context of {context} {why}")


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends generation: the generation config's and the tokenizer's EOS.
    `model`: a model, or its generation config (what an engine without one reads from the
    prepared model's directory)."""
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", model), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return sorted(ids)


def pad_id(tokenizer) -> int:
    """The id finished and left-padded rows receive: the pad token, else EOS (as generate())."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def special_ids(model, tokenizer) -> tuple[list[int], int]:
    return eos_ids(model, tokenizer), pad_id(tokenizer)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_threads(threads: int | None) -> None:
    """torch's CPU threads for this job (None: leave torch's choice)."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def set_deterministic(mode: str) -> None:
    """The deterministic axis: torch's deterministic algorithms on or off (cuBLAS needs a
    fixed workspace for them); `default` leaves torch as it is."""
    if mode == "default":
        return
    import torch

    if mode == "on":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(mode == "on")


def prepare_process(seed: int, threads: int | None, deterministic: str = "default") -> None:
    """Everything a job sets before it loads a model."""
    set_threads(threads)
    set_deterministic(deterministic)
    seed_everything(seed)
