"""The forms a KV cache takes: the speed-ups serving engines turn on by default, as axes.

Each is built from transformers' own cache classes, so that a cell runs what
`generate()` runs with the same option, and the decode loop equals `generate()`:

- `cache_impl: static`: `StaticCache`, sized prompt + `max_new_tokens` - 1 as
  `generate(cache_implementation="static")` sizes it;
- `kv_dtype`: `QuantizedCache` with the library's backends. `fp8_e4m3` is its `fp8`
  backend (a per-tensor scale calibrated on the first update, then frozen, as serving
  engines store an FP8 cache); `fp8_e5m2` is the same layer storing E5M2; `int4` is the
  `quanto` backend (optimum-quanto) and `int8` the `hqq` backend, both group-wise with the
  library's residual window of recent tokens kept unquantized (KIVI);
- `prefill_chunk: N`: the prompt's keys and values built N tokens at a time through the
  cache (`generate(prefill_chunk_size=N)`);
- `prefix_cache: on`: the longest prefix every prompt of the benchmark shares computed once;
  each prompt starts from a copy of its cache (`generate(cache=copy.deepcopy(prefix))`);
- `compile: on`: decode steps through the model's `get_compiled_call` (inductor), which is
  what `generate()` uses with a static cache.

Like every backend, a quantized cache returns the prefill's own keys and values to the
prefill's attention and stores them quantized for the steps after it.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Sequence

# torch and transformers are imported where they are used: config validation reads
# this module's tables and must not pay for them.

# kv_dtype -> (transformers QuantizedCache backend, its options, the package it needs)
# The axes that choose a cache form (each recorded under the cell's `cache_form`).
CACHE_FORM_AXES = ("prefill_chunk", "prefix_cache", "kv_dtype", "cache_impl", "compile")

KV_DTYPES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "fp8_e4m3": ("fp8", {}, None),
    "fp8_e5m2": ("fp8", {}, None),
    "int4": ("quanto", {"nbits": 4}, "optimum-quanto"),
    "int8": ("hqq", {"nbits": 8}, "hqq"),
}
# The package that provides each backend's module (what transformers imports).
_MODULES = {"optimum-quanto": "optimum.quanto", "hqq": "hqq"}


class CacheFormError(ValueError):
    """A cache form this installation or this model cannot build."""


def kv_dtype_unavailable(kv_dtype: str) -> str | None:
    """Why this installation cannot store a cache in `kv_dtype` (None if it can)."""
    if kv_dtype == "default":
        return None
    if kv_dtype not in KV_DTYPES:
        return f"unknown kv_dtype {kv_dtype!r} (known: default, {', '.join(KV_DTYPES)})"
    backend, _, package = KV_DTYPES[kv_dtype]
    if backend == "fp8":
        import transformers.cache_utils as cu

        if not hasattr(cu, "Fp8QuantizedLayer"):
            return (f"kv_dtype {kv_dtype}: transformers {importlib.metadata.version('transformers')} has no FP8 "
                    f"cache backend (Fp8QuantizedLayer)")
        return None
    if importlib.util.find_spec(_MODULES[package].split(".")[0]) is None:
        return (f"kv_dtype {kv_dtype}: transformers' {backend!r} cache backend needs the {package} package, which "
                f"is not installed" + (" (it pulls a CUDA build of torch and accelerate; pip install hqq)"
                                       if package == "hqq" else ""))
    return None


@functools.cache
def _fp8_e5m2_layer():
    """The library's FP8 cache layer (it ships E4M3) storing E5M2, with that format's range."""
    import torch
    from transformers.cache_utils import Fp8QuantizedLayer

    dtype = torch.float8_e5m2

    class Fp8E5M2Layer(Fp8QuantizedLayer):
        """E5M2 has infinities: a later token beyond the frozen scale's range would be stored
        as inf (torch saturates only E4M3FN), so it is clamped to the format's range first,
        as serving engines convert."""

        fp8_dtype = dtype
        fp8_max = torch.finfo(dtype).max

        def _quantize(self, tensor, scale=None):
            if scale is None:
                return super()._quantize(tensor)
            return (tensor.float() / scale).clamp(-self.fp8_max, self.fp8_max).to(self.fp8_dtype), scale

    return Fp8E5M2Layer


@dataclass(frozen=True)
class CacheForm:
    """How one cell builds and uses its KV cache (the defaults are transformers' DynamicCache,
    the whole prompt in one forward, no shared prefix, no compilation)."""

    impl: str = "dynamic"
    kv_dtype: str = "default"
    prefill_chunk: int | None = None
    prefix_cache: bool = False
    compiled: bool = False

    @classmethod
    def of(cls, cell) -> "CacheForm":
        chunk = None if cell.prefill_chunk == "default" else int(cell.prefill_chunk)
        return cls(impl=cell.cache_impl, kv_dtype=cell.kv_dtype, prefill_chunk=chunk,
                   prefix_cache=cell.prefix_cache == "on", compiled=cell.compile == "on")

    def new_cache(self, model, max_len: int):
        """An empty cache of this form for one batch whose sequences grow to `max_len`."""
        from transformers import DynamicCache, QuantizedCache, StaticCache

        config = model.config.get_text_config(decoder=True)
        if self.kv_dtype != "default":
            reason = kv_dtype_unavailable(self.kv_dtype)
            if reason:
                raise CacheFormError(reason)
            backend, options, _ = KV_DTYPES[self.kv_dtype]
            options = {**options, **_group_options(backend, config)}
            try:
                cache = QuantizedCache(backend, config, **options)
            except ValueError as exc:  # e.g. sliding-window layers, which no quantized layer supports
                raise CacheFormError(f"kv_dtype {self.kv_dtype}: {exc}") from None
            if self.kv_dtype == "fp8_e5m2":
                cache.layers = [_fp8_e5m2_layer()() for _ in cache.layers]
            return cache
        if self.impl == "static":
            return StaticCache(config=config, max_cache_len=max_len)
        return DynamicCache(config=config)

    def prefix(self, model, ids: list[int]) -> "Prefix":
        """The shared prefix's cache, filled once (in chunks if this form chunks its prefill)."""
        import torch

        cache = self.new_cache(model, 0)
        size = self.prefill_chunk or len(ids)
        with torch.inference_mode():
            for lo in range(0, len(ids), size):
                out = model(input_ids=torch.tensor([ids[lo:lo + size]], device=model.device),
                            position_ids=torch.arange(lo, min(lo + size, len(ids)), device=model.device)[None],
                            cache=cache, use_cache=True, logits_to_keep=1, return_dict=True)
                cache = out.cache
        return Prefix(list(ids), cache)

    def forward_for_steps(self, model):
        """What runs the decode steps after the prefill: the model, or its compiled call with
        the library's default compile settings (what `generate()` compiles)."""
        if not self.compiled:
            return model
        from transformers import CompileConfig

        return model.get_compiled_call(CompileConfig())

    def describe(self, config) -> dict[str, Any]:
        """The form as recorded in a cell's provenance."""
        d: dict[str, Any] = {"impl": self.impl, "kv_dtype": self.kv_dtype, "prefill_chunk": self.prefill_chunk,
                             "prefix_cache": self.prefix_cache, "compiled": self.compiled, "compile": None}
        if self.kv_dtype != "default":
            backend, options, package = KV_DTYPES[self.kv_dtype]
            d["backend"] = {"name": backend, **options, **_group_options(backend, config),
                            "package": package and {package: importlib.metadata.version(package)}}
        if self.compiled:
            d["compile"] = compile_environment()
        return d


def _group_options(backend: str, config) -> dict[str, Any]:
    """The integer backends quantize in groups of 64 (the library's default), which must
    divide the head size: a head size below 64 (tiny test models) takes its own size."""
    if backend == "fp8":
        return {}
    import math

    from tokenflip.models.size import head_size

    return {"q_group_size": math.gcd(64, head_size(config.to_dict()))}


def compile_environment() -> dict[str, Any]:
    """What a compiled forward depends on: torch's inductor and the C++ compiler it calls."""
    import torch

    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    version = None
    if compiler:
        try:
            version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            version = None
    return {"backend": "inductor", "torch": torch.__version__, "cxx": compiler, "cxx_version": version,
            "settings": {"fullgraph": False, "dynamic": None, "mode": "reduce-overhead"}}


@dataclass
class Prefix:
    """A shared prefix's token ids and the cache its forward filled (copied per prompt)."""

    ids: list[int]
    cache: Any

    def fresh_cache(self):
        return copy.deepcopy(self.cache)


def shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix every prompt shares, leaving each prompt at least one token
    of its own (the prefill that gives the first step's logits)."""
    if not prompts:
        return []
    shortest = min(len(p) for p in prompts)
    n = 0
    first = prompts[0]
    while n < shortest - 1 and all(p[n] == first[n] for p in prompts):
        n += 1
    return list(first[:n])
