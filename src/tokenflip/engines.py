"""The engine axis: which inference engine runs a cell.

`transformers` is tokenflip's own decode loop over a transformers model (`decode`).
`llama.cpp` runs the GGUF file a model was prepared from through llama-cpp-python, as
llama.cpp's users run it: with the cache on, the prompt is evaluated in one batch and then
one token per `llama_decode` against llama.cpp's own KV cache; with the cache off, the
cache is cleared and the whole sequence evaluated again at every step. Tokens are chosen
by tokenflip's own selectors from the engine's fp32 logits of the last position, so
decoding strategies, stop strings, EOS and the per-step record are exactly the transformers
cells'; the prompt ids come from the prepared model's tokenizer (the GGUF's own
vocabulary), so both engines read the same ids. A llama.cpp cell's weights are the GGUF's
(quantized blocks, dequantised inside each matrix product); its `precision` is the format
of what it computes and caches around them: llama.cpp computes activations in fp32 on a
CPU, and the precision sets its KV cache type (fp32 → F32; fp16 → F16, llama.cpp's default).
"""

from __future__ import annotations

import functools
import importlib.metadata
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from .jobs import COMPARABLE_AXES

# numpy, torch and llama_cpp are imported where they are used: config validation (in the
# Snakefile) reads this module and must not pay for them.

TRANSFORMERS = "transformers"
LLAMA_CPP = "llama.cpp"
ENGINES = (TRANSFORMERS, LLAMA_CPP)
LLAMA_CPP_PACKAGE = "llama-cpp-python"

# ggml's tensor type names of the KV cache, per cell precision (llama-cpp-python names no
# BF16 type, so a bf16 llama.cpp cell is refused).
KV_CACHE_TYPES = {"fp32": "F32", "fp16": "F16"}

# The axes a llama.cpp cell honours; every other axis must be at its default (validation
# names the value and why, and an axis added later is refused until it is listed here).
_FREE_AXES = ("precision", "cache", "decoding", "threads", "repeat", "engine")
_WHY = {
    "batch_size": "llama-cpp-python evaluates one sequence at a time (no left-padded batches)",
    "intervention": "interventions patch a transformers model's modules",
    "attention": "llama.cpp has its own attention kernels (not transformers' implementations)",
    "device": "the llama-cpp-python build is a CPU build",
    "deterministic": "torch's deterministic algorithms do not reach llama.cpp",
    "prefill_chunk": "cache forms are transformers' cache classes",
    "prefix_cache": "cache forms are transformers' cache classes",
    "kv_dtype": "the KV cache type follows the cell's precision",
    "cache_impl": "cache forms are transformers' cache classes",
    "compile": "llama.cpp is compiled ahead of time",
}


def unavailable(engine: str) -> str | None:
    """Why `engine` cannot run here (None if it can)."""
    if engine != LLAMA_CPP:
        return None
    try:
        importlib.metadata.version(LLAMA_CPP_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return (f"engine {LLAMA_CPP!r} needs the package {LLAMA_CPP_PACKAGE!r}, which is not installed "
                f"(it is pinned in requirements.lock: make .venv/.tokenflip-installed)")
    return None


def config_problems(config: dict[str, Any], defaults: dict[str, Any]) -> Iterator[str]:
    """What a grid asks of llama.cpp that it cannot honour, each with the reason."""
    for i, grid in enumerate(config["grids"]):
        if LLAMA_CPP not in [str(v) for v in grid.get("engine", [defaults["engine"]])]:
            continue
        where = f"grids.{i}"
        reason = unavailable(LLAMA_CPP)
        if reason:
            yield f"{where}: {reason}"
        for name in grid.get("models", list(config["models"])):
            source = config["models"][name]["source"]
            if source != "gguf-package":
                yield (f"{where}: engine 'llama.cpp' with model {name!r}: no GGUF is available for source "
                       f"{source!r} (llama.cpp runs a model's GGUF file: source gguf-package)")
        for precision in grid["precision"]:
            if precision not in KV_CACHE_TYPES:
                yield (f"{where}: engine 'llama.cpp' with precision {precision!r}: llama-cpp-python offers KV "
                       f"cache types for {sorted(KV_CACHE_TYPES)} only")
        for axis in COMPARABLE_AXES:
            if axis in _FREE_AXES:
                continue
            why = _WHY.get(axis, "llama.cpp cells do not implement this axis")
            for value in grid.get(axis, [defaults.get(axis)]):
                if axis == "batch_size" and int(value) == 1:
                    continue
                if axis == "intervention" and config["interventions"].get(value, {}).get("kind") == "none":
                    continue
                if axis == "device" and str(value) in ("default", "cpu"):
                    continue
                if axis not in ("batch_size", "intervention", "device") and str(value) == str(defaults[axis]):
                    continue
                yield (f"{where}: engine 'llama.cpp' with {axis} {value!r}: {why} "
                       f"(put the llama.cpp cells in a grid of their own)")


def probe_problems(config: dict[str, Any]) -> Iterator[str]:
    """A probe over a model and benchmark whose cells all run in llama.cpp: probes replay the
    transformers model, so it would trace something the study does not run."""
    from .plan import expand_cells, probe_targets

    engines_of: dict[tuple[str, str], set[str]] = {}
    for cell in expand_cells(config):
        engines_of.setdefault((cell.model, cell.benchmark), set()).add(cell.engine)
    for probe, model, benchmark in probe_targets(config):
        if engines_of.get((model, benchmark)) == {LLAMA_CPP}:
            yield (f"probes.{probe}: model {model!r} on benchmark {benchmark!r} has only llama.cpp cells; probes "
                   f"replay the transformers model (add transformers cells, or name other benchmarks under "
                   f"probes.{probe}.benchmarks)")


def gguf_path(spec: dict[str, Any]) -> Path:
    from .models import _package_file

    return _package_file(spec["package"], spec["file"])


@functools.lru_cache(maxsize=1)
def build_digest() -> str:
    """One digest of the compiled libraries llama-cpp-python loads: the same version built on
    another machine (llama.cpp compiles for the CPU it is built on) is another engine."""
    import llama_cpp

    from .models import digest_files

    lib = Path(llama_cpp.__file__).parent / "lib"
    return digest_files([p for p in lib.iterdir() if p.is_file() and not p.is_symlink()], lib)


class LlamaCpp:
    """One GGUF loaded in llama.cpp, decoding one prompt at a time as a cell asks."""

    def __init__(self, path: Path, precision: str, n_ctx: int, threads: int | None):
        import llama_cpp

        self._lib = llama_cpp
        kv_type = getattr(llama_cpp, f"GGML_TYPE_{KV_CACHE_TYPES[precision]}")
        self.threads = int(threads or 1)
        # One batch holds a whole sequence, so a prompt (and, with the cache off, the whole
        # sequence) is one llama_decode, as one forward is in the transformers cells.
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                                   n_threads=self.threads, n_threads_batch=self.threads, type_k=kv_type,
                                   type_v=kv_type, flash_attn=False, logits_all=False, n_gpu_layers=0,
                                   verbose=False)
        self.precision = precision
        self.n_vocab = self.llm.n_vocab()

    def describe(self) -> dict[str, Any]:
        """The engine as recorded in a cell's provenance: versions, build features, settings."""
        info = self._lib.llama_print_system_info()
        return {"name": LLAMA_CPP, "package": {LLAMA_CPP_PACKAGE: importlib.metadata.version(LLAMA_CPP_PACKAGE)},
                "system_info": info.decode() if isinstance(info, bytes) else str(info),
                "build_sha256": build_digest(),
                "n_ctx": int(self.llm.n_ctx()), "n_batch": int(self.llm.n_batch), "n_threads": self.threads,
                "kv_cache_type": KV_CACHE_TYPES[self.precision], "flash_attn": False, "activations": "fp32",
                "file_type": self.llm.metadata.get("general.file_type")}

    def _last_logits(self):
        import numpy as np
        import torch

        ptr = self._lib.llama_get_logits_ith(self.llm.ctx, -1)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())[None]

    def _evaluate(self, sequence: list[int], new: int, use_cache: bool):
        """The logits after `sequence`: its last `new` tokens through the cache, or, with the
        cache off, the whole sequence from an empty cache."""
        if not use_cache:
            self.llm.reset()
            new = len(sequence)
        self.llm.eval(sequence[len(sequence) - new:])
        return self._last_logits()

    def decode(self, prompt: Sequence[int], *, max_new_tokens: int, use_cache: bool,
               eos_token_ids: Sequence[int], record_top_k: int, select, stop):
        """Generate one prompt; a `decode.BatchResult` of one row, ended as `decode` ends it."""
        import torch

        from .decode import BatchResult, Generation, record_step

        gen = Generation()
        sequence = list(prompt)
        eos = set(int(e) for e in eos_token_ids)
        active = torch.ones(1, dtype=torch.bool)
        self.llm.reset()
        start = time.perf_counter()
        steps = 0
        for step in range(max_new_tokens):
            logits = self._evaluate(sequence, len(prompt) if step == 0 else 1, use_cache)
            chosen = select(logits, step)
            record_step([gen], logits, chosen, active, record_top_k, None)
            token = int(chosen[0])
            sequence.append(token)
            steps += 1
            if token in eos:
                gen.finish_reason = "eos"
                break
            if stop is not None and bool(stop(torch.tensor([sequence]), logits)[0]):
                gen.finish_reason = "stop"
                break
        return BatchResult([gen], time.perf_counter() - start, steps)
