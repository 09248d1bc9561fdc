"""tokenflip's own decode loop over a transformers model (`decode`), with the cell's
cache form (`caches`), interventions and every axis: the reference engine, the one probes
replay."""

from __future__ import annotations

from typing import Any, Iterator

from tokenflip.core.axes import Proof
from tokenflip.run.caches import CACHE_FORM_AXES
from tokenflip.run.engines.base import Decoded, Engine

TRANSFORMERS = "transformers"
# In a process that keeps its load for the jobs that share it (`run.shared_loads`): the last
# load, by its arguments (None: every job loads its own).
_KEPT: dict[tuple, tuple] | None = None


def keep_loads() -> None:
    """From now on this process keeps its last load for the next job that asks for the same
    one (a shared load's jobs run no intervention: they leave the model as loaded)."""
    global _KEPT
    _KEPT = {}


def _load(model_dir, precision: str, device: str, attention: str):
    from pathlib import Path

    from tokenflip.models.prepare import load_prepared

    key = (str(Path(model_dir).resolve()), precision, device, attention)
    if _KEPT is not None and key in _KEPT:
        return _KEPT[key]
    loaded = load_prepared(model_dir, precision, device, attention)
    if _KEPT is not None:
        _KEPT.clear()
        _KEPT[key] = loaded
    return loaded


def _loaded_dtype(job, record) -> str:
    from tokenflip.models.prepare import DTYPE_NAMES, PRECISIONS
    from tokenflip.run.interventions import weights_precision

    return DTYPE_NAMES[PRECISIONS[weights_precision(job.intervention, job.cell.precision)]]


class Transformers(Engine):
    name = TRANSFORMERS
    # Every axis but those of serving engines' schedulers.
    honours = ("precision", "cache", "batch_size", "decoding", "intervention", "attention", "threads", "device",
               "deterministic", "repeat", "prefill_chunk", "prefix_cache", "kv_dtype", "cache_impl", "compile",
               "engine")
    # The dtype the loaded model computes in (fp32 for the interventions that load fp32 weights).
    proofs = {"precision": Proof("engine.dtype", _loaded_dtype)}
    # Beyond each axis's proof: an fp32-weights intervention changes the loaded dtype too.
    axis_provenance = {"intervention": ("engine.dtype",)}
    why = {
        "concurrency": "requests in flight are a serving engine's scheduler setting; tokenflip's decode loop runs "
                       "fixed batches (use batch_size)",
        "batch_invariant": "batch-invariant kernels are vLLM's (VLLM_BATCH_INVARIANT)",
        "tensor_parallel": "tokenflip's decode loop runs the model on one device",
    }

    def grid_problems(self, config, grid, where, defaults) -> Iterator[str]:
        yield from cache_form_problems(config, grid, where, defaults)

    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:
        from tokenflip.models.prepare import DTYPE_NAMES, load_prepared, weights_record
        from tokenflip.run import runtime
        from tokenflip.run.caches import CacheForm
        from tokenflip.run.cell_output import decode_batches, model_record
        from tokenflip.run.interventions import apply_to_model, weights_precision

        cell = job.cell
        model, tokenizer, manifest = _load(model_dir, weights_precision(job.intervention, cell.precision),
                                           job.device, cell.attention)
        # What the model computes in, read from the model itself before an intervention
        # rewires it (global_fp32 widens a 16-bit model on purpose).
        dtype = DTYPE_NAMES.get(model.dtype, str(model.dtype))
        attention = model.config._attn_implementation
        model = apply_to_model(model, job.intervention,
                               lambda precision: load_prepared(model_dir, precision, job.device, cell.attention)[0])
        form = CacheForm.of(cell)
        prefix = shared_prompt_prefix(form, model, tokenizer, bench)
        eos, pad = runtime.special_ids(model, tokenizer)
        use_cache = cell.cache == "on"
        observed: dict[str, Any] = {}
        batches = decode_batches(job, tokenizer, bench, decoder(job, model, eos, pad, form, prefix, use_cache), pad,
                                 progress, model.device, observed)
        record = {
            "model": {**model_record(manifest),
                      "weights": weights_record(manifest, weights_precision(job.intervention, cell.precision))},
            "cache_form": {**form.describe(model.config.get_text_config(decoder=True)),
                           "prefix_tokens": len(prefix.ids) if prefix else 0},
            "engine": {"name": TRANSFORMERS, "dtype": dtype, "attn_implementation": attention,
                       "use_cache": use_cache, "intervention": job.intervention.get("kind", "none")},
        }
        return Decoded(batches, tokenizer, eos, pad, model.device, record, observed=observed)


def decoder(job, model, eos: list[int], pad: int, form=None, prefix=None, use_cache: bool | None = None):
    """tokenflip's decode loop over the transformers model, with the cell's cache form (and,
    with a prefix cache, every prompt from the shared prefix)."""
    from tokenflip.run.caches import CacheForm
    from tokenflip.run.decode import BatchResult, decode

    form = form or CacheForm()
    use_cache = job.cell.cache == "on" if use_cache is None else use_cache

    def decode_batch(ids, mask, select, stop) -> BatchResult:
        return decode(model, ids, mask, max_new_tokens=job.max_new_tokens, use_cache=use_cache,
                      eos_token_ids=eos, pad_token_id=pad, record_top_k=job.record_top_k, select=select,
                      stop=stop, form=form, prefix=prefix)

    return decode_batch


def shared_prompt_prefix(form, model, tokenizer, bench):
    """With a prefix cache, the longest prefix all the benchmark's prompts share (the
    few-shot exemplars, the system turn), its cache filled once (None when they share none)."""
    from tokenflip.run import runtime
    from tokenflip.run.caches import shared_prefix

    if not form.prefix_cache:
        return None
    common = shared_prefix([runtime.encode_prompt(tokenizer, bench, item) for item in bench.items()])
    return form.prefix(model, common) if common else None


def cache_form_problems(config: dict[str, Any], grid: dict[str, Any], where: str,
                        defaults: dict[str, Any]) -> Iterator[str]:
    """Cache forms a grid combines that cannot run, each with the reason (a grid is a cross
    product: put such values in grids of their own)."""
    from tokenflip.run.caches import kv_dtype_unavailable
    from tokenflip.run.interventions import INTERVENTIONS

    def values(axis):
        return [str(v) for v in grid.get(axis, [defaults[axis]])]

    changed = {axis: [v for v in values(axis) if v != defaults[axis]] for axis in CACHE_FORM_AXES}
    if "off" in grid["cache"]:
        for axis, vs in changed.items():
            if vs:
                yield (f"{where}: {axis} {vs[0]!r} with cache 'off': with no cache nothing is cached "
                       f"(put the cache-off cells in a grid of their own)")
    if "cold" in changed["prefix_cache"]:
        yield (f"{where}: prefix_cache 'cold' with engine 'transformers': tokenflip's prefix cache is the shared "
               f"prefix computed once before the first prompt (that is 'on'); 'cold' is a serving engine's cache "
               f"that fills as requests arrive")
    if changed["prefix_cache"]:
        if any(int(b) > 1 for b in grid["batch_size"]):
            yield (f"{where}: prefix_cache 'on' with batch size {max(grid['batch_size'])}: left padding puts "
                   f"pad tokens before the shared prefix, so a padded row cannot start from its cache")
        if changed["cache_impl"]:
            yield (f"{where}: prefix_cache 'on' with cache_impl 'static': a static cache is sized per batch "
                   f"(prompt + max_new_tokens), a shared prefix's cache would fix one size for all")
    if changed["kv_dtype"] and changed["cache_impl"]:
        yield (f"{where}: kv_dtype {changed['kv_dtype'][0]!r} with cache_impl 'static': transformers' "
               f"quantized caches are dynamic")
    if changed["compile"]:
        if "dynamic" in values("cache_impl"):
            yield (f"{where}: compile 'on' needs cache_impl 'static' in every cell: generate() compiles the "
                   f"forward only with a static cache (a dynamic one changes shape at every step)")
        if changed["prefill_chunk"]:
            yield (f"{where}: compile 'on' with prefill_chunk {changed['prefill_chunk'][0]!r}: generate() also "
                   f"compiles a chunked prefill, and only the compiled decode steps are built to equal it")
        for label in values("intervention"):
            kind = config["interventions"].get(label, {}).get("kind", "none")
            if kind in INTERVENTIONS and INTERVENTIONS[kind].loads:
                yield (f"{where}: compile 'on' with intervention {label!r}: kind {kind!r} runs several "
                       f"copies of the model, which have no compiled call")
    for kv_dtype in changed["kv_dtype"]:
        reason = kv_dtype_unavailable(kv_dtype)
        if reason:
            yield f"{where}: {reason}"


