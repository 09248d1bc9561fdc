"""llama.cpp as an engine: it runs the GGUF file a model was prepared from through llama-cpp-python, as
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

Weight repacking is off on every CPU (`use_extra_bufts = False`: no CPU_REPACK or AMX buffer
types): ggml's AMX buffer segfaults on every evaluation of more than one token of a Q4_1 GGUF
on AMX Xeons (llama.cpp#20824), and with it off one GGUF runs the same weight layout on AVX2,
AVX-512 and AMX CPUs. The setting, read back from the model's parameters, and the build's
own features (`system_info`) are recorded in every cell's engine identity, so a repacked
run would be another engine. The engine decodes in a process of its own (`worker.isolated`):
a crash in its native code fails the cell, naming the signal, the build and the CPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from tokenflip.core.axes import Proof
from tokenflip.run.engines.base import Decoded, Engine, grid_values

# numpy, torch and llama_cpp are imported where they are used: config validation (in the
# Snakefile) reads this module and must not pay for them.

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_PACKAGE = "llama-cpp-python"

# ggml's tensor type names of the KV cache, per cell precision (llama-cpp-python names no
# BF16 type, so a bf16 llama.cpp cell is refused).
KV_CACHE_TYPES = {"fp32": "F32", "fp16": "F16"}


class LlamaCppEngine(Engine):
    name = LLAMA_CPP
    honours = ("precision", "cache", "decoding", "threads", "device", "repeat", "engine")
    # llama.cpp's own record of what it ran: its KV cache type (from the precision), its
    # threads, and where it computes (no layer offloaded: the CPU).
    proofs = {"precision": Proof("engine.kv_cache_type", lambda job, rec: KV_CACHE_TYPES[job.cell.precision]),
              "threads": Proof("engine.n_threads", lambda job, rec: job.threads),
              "device": Proof("engine.device", lambda job, rec: None if job.device == "auto" else job.device)}
    why = {
        "batch_size": "llama-cpp-python evaluates one sequence at a time (no left-padded batches)",
        "intervention": "interventions patch a transformers model's modules",
        "attention": "llama.cpp has its own attention kernels (not transformers' implementations)",
        "deterministic": "torch's deterministic algorithms do not reach llama.cpp",
        "prefill_chunk": "cache forms are transformers' cache classes",
        "prefix_cache": "cache forms are transformers' cache classes",
        "kv_dtype": "the KV cache type follows the cell's precision",
        "cache_impl": "cache forms are transformers' cache classes",
        "compile": "llama.cpp is compiled ahead of time",
        "concurrency": "llama-cpp-python runs one request at a time",
        "batch_invariant": "batch-invariant kernels are vLLM's (VLLM_BATCH_INVARIANT)",
        "tensor_parallel": "the llama-cpp-python build runs on the CPU",
    }
    # What its precision, threads and cache change (KV cache type, n_threads, use_cache) are
    # the records that prove them, which `compare` lets differ on their axis already.

    def unavailable(self) -> str | None:
        try:
            importlib.metadata.version(LLAMA_CPP_PACKAGE)
        except importlib.metadata.PackageNotFoundError:
            return (f"engine {LLAMA_CPP!r} needs the package {LLAMA_CPP_PACKAGE!r}, which is not installed "
                    f"(install it with `make llama-cpp`: requirements-llama-cpp.lock, built from its sdist)")
        return None

    def grid_problems(self, config, grid, where, defaults) -> Iterator[str]:
        for name in grid.get("models", list(config["models"])):
            source = config["models"][name]["source"]
            if source != "gguf-package":
                yield (f"{where}: engine 'llama.cpp' with model {name!r}: no GGUF is available for source "
                       f"{source!r} (llama.cpp runs a model's GGUF file: source gguf-package)")
        for device in grid_values(grid, "device", defaults):
            if device == "cuda":
                yield (f"{where}: engine 'llama.cpp' with device 'cuda': the llama-cpp-python build is a CPU "
                       f"build")
        for precision in grid["precision"]:
            if precision not in KV_CACHE_TYPES:
                yield (f"{where}: engine 'llama.cpp' with precision {precision!r}: llama-cpp-python offers KV "
                       f"cache types for {sorted(KV_CACHE_TYPES)} only")

    def job_device(self, cell, configured: str) -> str:
        return "cpu"  # the llama-cpp-python build is a CPU build (a cell asking for cuda is refused)

    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:
        from tokenflip.run.engines.worker import isolated

        return isolated(decode_in_process, (job.to_json(), str(model_dir), progress), what=f"engine {LLAMA_CPP!r}",
                        build=build_flags)


def decode_in_process(job_json: dict[str, Any], model_dir: str, progress: bool) -> Decoded:
    """The engine's process: the job as the cell runner prepared its own, then the decode."""
    from tokenflip.core.specs import CellJob
    from tokenflip.run import runtime
    from tokenflip.run.benchmarks import job_benchmark

    job = CellJob.from_json(job_json)
    runtime.prepare_process(job.run_seed, job.threads, job.cell.deterministic)
    return decode_llama_cpp(job, job_benchmark(job), model_dir, progress)


def disable_weight_repack() -> None:
    """Every model this process loads through llama-cpp-python from now on is loaded without
    the extra (repacking) buffer types, as `llama_model_params.use_extra_bufts = False` asks.
    llama-cpp-python's `Llama` offers no argument for it, so the defaults it starts from are
    wrapped; idempotent."""
    import llama_cpp.llama_cpp as lib

    if getattr(lib.llama_model_default_params, "tokenflip_without_repack", False):
        return
    defaults = lib.llama_model_default_params

    def without_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    without_repack.tokenflip_without_repack = True  # type: ignore[attr-defined]
    lib.llama_model_default_params = without_repack


def load(path: str | Path, **settings):
    """llama-cpp-python's `Llama` on a GGUF without weight repacking: the engine's, the
    server's and the tests' reference generation all load models through this."""
    import llama_cpp

    disable_weight_repack()
    llm = llama_cpp.Llama(model_path=str(path), **settings)
    if llm.model_params.use_extra_bufts:
        raise RuntimeError(f"{path}: llama.cpp loaded it with weight repacking on; tokenflip turns it off")
    return llm


def system_info() -> str:
    """ggml's features as this build runs them on this CPU (`llama_print_system_info`)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    return info.decode() if isinstance(info, bytes) else str(info)


def build_flags() -> str:
    """The build as a crash report names it: the package's version, ggml's features for this
    CPU, and the repacking setting."""
    return (f"{LLAMA_CPP_PACKAGE} {importlib.metadata.version(LLAMA_CPP_PACKAGE)}, {system_info().strip()}, "
            f"weight repacking off")


def gguf_path(spec: dict[str, Any]) -> Path:
    from tokenflip.models.prepare import package_file

    return package_file(spec["package"], spec["file"])


@functools.lru_cache(maxsize=1)
def build_digest() -> str:
    """One digest of the compiled libraries llama-cpp-python loads: the same version built on
    another machine (llama.cpp compiles for the CPU it is built on) is another engine."""
    import llama_cpp

    from tokenflip.models.prepare import digest_files

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
        self.llm = load(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=self.threads,
                        n_threads_batch=self.threads, type_k=kv_type, type_v=kv_type, flash_attn=False,
                        logits_all=False, n_gpu_layers=0, verbose=False)
        self.precision = precision
        self.n_vocab = self.llm.n_vocab()

    def describe(self) -> dict[str, Any]:
        """The engine as recorded in a cell's provenance: versions, build features, settings."""
        return {"name": LLAMA_CPP, "package": {LLAMA_CPP_PACKAGE: importlib.metadata.version(LLAMA_CPP_PACKAGE)},
                "system_info": system_info(),
                "build_sha256": build_digest(),
                # read back from llama.cpp's context, not the value handed to it
                "n_ctx": int(self.llm.n_ctx()), "n_batch": int(self.llm.n_batch),
                "n_threads": int(self._lib.llama_n_threads(self.llm.ctx)),
                "n_gpu_layers": 0, "device": "cpu",
                # read back from the parameters the model was loaded with (see the module's docstring)
                "weight_repack": bool(self.llm.model_params.use_extra_bufts),
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

        from tokenflip.run.decode import BatchResult
        from tokenflip.run.step_record import Generation, record_step

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


def decode_llama_cpp(job, bench, model_dir, progress: bool) -> Decoded:
    """The cell through llama.cpp, on the GGUF file the model was prepared from (its digest
    checked against the one recorded at preparation)."""
    import torch
    from transformers import GenerationConfig

    from tokenflip.models.prepare import ModelError, load_tokenizer, read_manifest, sha256_file
    from tokenflip.run import runtime
    from tokenflip.run.cell_output import decode_batches, model_record
    from tokenflip.run.decode import BatchResult, generated_only

    manifest = read_manifest(model_dir)
    path = gguf_path(manifest["spec"])
    digest = sha256_file(path)
    if digest != manifest.get("source_digest"):
        raise ModelError(f"{path}: its digest {digest[:12]}… is not the one {model_dir} was prepared from "
                         f"({str(manifest.get('source_digest'))[:12]}…); prepare the model again")
    tokenizer = load_tokenizer(model_dir)
    eos, pad = runtime.special_ids(GenerationConfig.from_pretrained(str(model_dir)), tokenizer)
    longest = max(len(runtime.encode_prompt(tokenizer, bench, item)) for item in bench.items())
    # The job's threads as torch took them (generation.threads, else what Snakemake gave the job).
    engine = LlamaCpp(path, job.cell.precision, longest + job.max_new_tokens, job.threads or torch.get_num_threads())
    if engine.n_vocab != len(tokenizer):
        raise ModelError(f"{path}: llama.cpp reads {engine.n_vocab} tokens, the prepared tokenizer {len(tokenizer)}; "
                         f"their ids would not be the same tokens")

    use_cache = job.cell.cache == "on"

    def decode_batch(ids, mask, select, stop) -> BatchResult:
        return engine.decode(ids[0].tolist(), max_new_tokens=job.max_new_tokens, use_cache=use_cache,
                             eos_token_ids=eos, record_top_k=job.record_top_k, select=select,
                             stop=generated_only(stop, ids.shape[1]))

    observed: dict[str, Any] = {}
    batches = decode_batches(job, tokenizer, bench, decode_batch, pad, progress, observed=observed)
    described = engine.describe()
    record = {
        "model": {**model_record(manifest),
                  "weights": {"gguf": path.name, "gguf_sha256": digest, "file_type": described["file_type"]}},
        "cache_form": {"impl": "llama.cpp"},  # llama.cpp's own KV cache (its type: engine.kv_cache_type)
        "engine": {**described, "use_cache": use_cache},
    }
    return Decoded(batches, tokenizer, eos, pad, torch.device("cpu"), record, observed=observed)
