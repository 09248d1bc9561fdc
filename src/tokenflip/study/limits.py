"""Bounds a config's values must keep for its jobs to run, from the model and the machine:
a random model's sizes consistent and within this machine's memory, and every generation
within its model's context. Each message names the key, the value and the bound."""

from __future__ import annotations

import os
from typing import Any, Iterator

from tokenflip.models.size import context_length, head_size, random_model_config

__all__ = ["model_problems", "machine_memory_bytes", "longest_generation", "context_length"]

_FP32_BYTES = 4


def machine_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _parameters(fields: dict[str, Any]) -> int:
    """A random model's parameter count without its embeddings (attention, MLP or experts, norms)."""
    hidden, heads, head_dim = fields["hidden_size"], fields["num_attention_heads"], head_size(fields)
    kv_heads = fields.get("num_key_value_heads") or heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * fields["intermediate_size"] * (fields.get("num_experts") or 1)
    return fields["num_hidden_layers"] * (attention + mlp + 2 * hidden)


def _geometry_problems(where: str, fields: dict[str, Any]) -> Iterator[str]:
    """Sizes that no model of the architecture can have (transformers would fail building it)."""
    heads, kv_heads = fields["num_attention_heads"], fields.get("num_key_value_heads")
    if not fields.get("head_dim") and fields["hidden_size"] % heads:
        yield (f"{where}: hidden_size {fields['hidden_size']} is not a multiple of num_attention_heads {heads} "
               f"(set head_dim, or sizes that divide)")
    if kv_heads and heads % kv_heads:
        yield f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
    if fields.get("num_experts_per_tok") and fields["num_experts_per_tok"] > fields.get("num_experts", 0):
        yield (f"{where}: num_experts_per_tok {fields['num_experts_per_tok']} is more than num_experts "
               f"{fields.get('num_experts')}")


def _generations(config: dict[str, Any]) -> Iterator[tuple[str, str, str, int]]:
    """(model, benchmark, key, max_new_tokens) of every generation the config runs: each
    benchmark's cells and each probe's replays."""
    from tokenflip.study.plan import expand_cells, probe_targets

    for model, bench in sorted({(c.model, c.benchmark) for c in expand_cells(config)}):
        spec = config["benchmarks"][bench]
        key = f"benchmarks.{bench}.max_new_tokens" if "max_new_tokens" in spec else "generation.max_new_tokens"
        yield model, bench, key, spec.get("max_new_tokens", config["generation"]["max_new_tokens"])
    for probe, model, bench in probe_targets(config):
        if config["probes"][probe].get("max_new_tokens"):
            yield model, bench, f"probes.{probe}.max_new_tokens", config["probes"][probe]["max_new_tokens"]


def longest_generation(config: dict[str, Any], model: str, benchmark: str) -> int:
    """The most new tokens any cell or probe generates for this model and benchmark."""
    spec = config["benchmarks"][benchmark]
    return max((tokens for m, b, _, tokens in _generations(config) if (m, b) == (model, benchmark)),
               default=spec.get("max_new_tokens", config["generation"]["max_new_tokens"]))


def model_problems(config: dict[str, Any]) -> Iterator[str]:
    """A random model's sizes: consistent, within this machine's memory in fp32 (the
    precision it is built in), and a context (max_position_embeddings) that holds every
    generation asked of it with a prompt of at least one token. Other sources' context is
    checked against the longest prompt before any generation job (`runtime.context_problem`)."""
    random_models = {name: spec for name, spec in config["models"].items() if spec["source"] == "random"}
    if not random_models:
        return
    memory = machine_memory_bytes()
    context = {}
    for name, spec in random_models.items():
        where = f"models.{name}.overrides"
        fields = random_model_config(spec)
        problems = list(_geometry_problems(where, fields))
        yield from problems
        if problems:
            continue
        size = _parameters(fields) * _FP32_BYTES
        if size > memory:
            yield (f"{where}: {fields['num_hidden_layers']} layers of hidden_size {fields['hidden_size']} make "
                   f"{size / 2**30:.1f} GiB of fp32 weights (embeddings not counted), more than this machine's "
                   f"{memory / 2**30:.1f} GiB of memory")
        context[name] = fields.get("max_position_embeddings")
    for model, key, tokens in sorted({(m, key, tokens) for m, _, key, tokens in _generations(config)}):
        if context.get(model) is not None and tokens >= context[model]:
            yield (f"{key}: {tokens} new tokens and a prompt do not fit in model {model!r}'s context of "
                   f"{context[model]} positions (max_position_embeddings; a static cache and llama.cpp's n_ctx "
                   f"are sized prompt + max_new_tokens)")
