"""vLLM as an engine: the prepared model (the same safetensors and tokenizer the
transformers cells load, the same prompt ids) through vLLM's offline `LLM` API, with its
scheduler's knobs as axes, each honoured by vLLM itself:

- `concurrency`: how many requests vLLM holds at once (`max_num_seqs`); every prompt is
  submitted together, so this is the batch composition a server under load sees;
- `prefix_cache`: `off`; `cold` (`enable_prefix_caching`, the cache filled as requests
  arrive: a request hits what earlier requests computed); `on` (the cache warmed by one
  pass over the same prompts first, so every prompt starts from its cached blocks: the
  "identical later requests" of a server). The hits are recorded per prompt;
- `prefill_chunk: N`: chunked prefill with `max_num_batched_tokens = N`;
- `kv_dtype`: `kv_cache_dtype` fp8_e4m3 / fp8_e5m2;
- `compile: on`: vLLM's default compilation (torch.compile, and CUDA graphs on CUDA)
  instead of eager (`enforce_eager`);
- `batch_invariant: on`: `VLLM_BATCH_INVARIANT=1` (CUDA only);
- `tensor_parallel`: `tensor_parallel_size`;
- `threads`: on a CPU, the cores vLLM binds its OpenMP threads to
  (`VLLM_CPU_OMP_THREADS_BIND`), taken from the job's own CPU set.

vLLM pins its own torch and transformers, so it runs in an environment of its own
(`make vllm`), through the out-of-process engines' protocol (`run.engines.worker`): `vllm_offline/worker.py`
returns ids and each step's top-k raw logits (`logprobs_mode="raw_logits"`, so logits and
margins mean what they mean in the other engines). vLLM returns only the top-k, so the
full-vocabulary log-sum-exp and entropy are recorded as NaN.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from tokenflip.core.axes import Proof
from tokenflip.core.cpu_flags import cpu_flags
from tokenflip.run.engines import worker
from tokenflip.run.engines.base import Decoded, Engine, grid_values
from tokenflip.run.engines.vllm_offline.support import (
    VllmError,
    check_resolved,
    cuda_devices,
    fp8_cache_problem,
    generations,
    head_size_problem,
)

VLLM = "vllm"
PYTHON_VARIABLE = "TOKENFLIP_VLLM_PYTHON"
ENV_DIR = ".venv-vllm"
WORKER = Path(__file__).with_name("worker.py")

# precision -> vLLM's dtype
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")


# The variables that select vLLM's kernels and placement; recorded with each cell.
ENV_KEYS = ("VLLM_BATCH_INVARIANT", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
            "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ATTENTION_BACKEND", "VLLM_ENABLE_V1_MULTIPROCESSING",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# vLLM's max_num_seqs when none is given: the offline LLM class on a CPU build holds 256 per
# tensor-parallel rank (vllm.engine.arg_utils, 0.32.0); on CUDA it depends on the GPU's memory
# (1024 on an H100 or H200), so there it is not known before the engine starts.
DEFAULT_MAX_NUM_SEQS = 256


def default_max_num_seqs(device: str, tensor_parallel: int) -> int | None:
    """The requests in flight vLLM holds when the cell names none (None: not known here)."""
    return DEFAULT_MAX_NUM_SEQS * tensor_parallel if device == "cpu" else None
# The KV cache vLLM reserves on a CPU (GiB) unless the user's environment says otherwise.
CPU_KVCACHE_GIB = "1"


def python() -> Path | None:
    """The interpreter of vLLM's environment: $TOKENFLIP_VLLM_PYTHON, else `.venv-vllm`
    in the working directory, else beside the environment tokenflip runs in."""
    if os.environ.get(PYTHON_VARIABLE):
        return Path(os.environ[PYTHON_VARIABLE])
    for root in (Path.cwd(), Path(sys.prefix).parent):
        candidate = root / ENV_DIR / "bin" / "python"
        if candidate.exists():
            return candidate
    return None


@functools.lru_cache(maxsize=4)
def _installed(interpreter: str) -> dict[str, Any]:
    """Which vLLM build that interpreter has (read from package metadata: no import of vLLM)."""
    script = ("import importlib.metadata as m, json\n"
              "out = {}\n"
              "for n in ('vllm', 'vllm-cpu', 'torch', 'transformers'):\n"
              "    try: out[n] = m.version(n)\n"
              "    except m.PackageNotFoundError: pass\n"
              "print(json.dumps(out))\n")
    try:
        proc = subprocess.run([interpreter, "-c", script], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{interpreter} does not run: {exc}"}
    if proc.returncode != 0:
        return {"error": f"{interpreter} failed: {proc.stderr.strip()[-300:]}"}
    return json.loads(proc.stdout)


def installed() -> dict[str, Any]:
    """{distribution: version, ...} of vLLM's environment, or {"error": why}."""
    interpreter = python()
    if interpreter is None:
        return {"error": "no vLLM environment found"}
    return _installed(str(interpreter))


def platform_of(info: dict[str, Any]) -> str:
    """The device the installed build runs on: the `vllm-cpu` build on CPUs, `vllm` on CUDA."""
    return "cpu" if "vllm-cpu" in info else "cuda"


def build_device() -> str | None:
    """The device of the installed vLLM build (None where no vLLM environment is found)."""
    info = installed()
    return None if "error" in info else platform_of(info)


_INSTALL = ("build it with `make vllm` (CPU: `.venv-vllm` from requirements-vllm-cpu.lock; on CUDA see "
            "docs/engines.md), or point $TOKENFLIP_VLLM_PYTHON at a Python that has vllm")


def _args(name: str, expect) -> Proof:
    """A proof read from the engine arguments as vLLM resolved them."""
    return Proof(f"engine.args.{name}", expect)


class Vllm(Engine):
    name = VLLM
    honours = ("precision", "cache", "decoding", "threads", "repeat", "engine", "device", "prefill_chunk",
               "prefix_cache", "kv_dtype", "compile", "concurrency", "batch_invariant", "tensor_parallel")
    # What vLLM resolved, per axis: its engine arguments, its environment, the sampling
    # parameters it ran and the cores its threads were bound to.
    proofs = {
        "precision": _args("dtype", lambda job, rec: DTYPES[job.cell.precision]),
        "decoding": Proof("engine.sampling.temperature", lambda job, rec: sampling_of(job.decoding)["temperature"]),
        # threads are the cores a CPU build binds; a CUDA build's threads are not the computation's
        "threads": Proof("engine.n_threads", lambda job, rec: job.threads if job.device == "cpu" else None),
        "device": Proof("engine.platform.device_type", lambda job, rec: None if job.device == "auto" else job.device),
        "prefill_chunk": _args("max_num_batched_tokens",
                               lambda job, rec: None if job.cell.prefill_chunk == "default"
                               else int(job.cell.prefill_chunk)),
        "prefix_cache": _args("enable_prefix_caching", lambda job, rec: job.cell.prefix_cache != "off"),
        "kv_dtype": _args("kv_cache_dtype", lambda job, rec: None if job.cell.kv_dtype == "default"
                          else job.cell.kv_dtype),
        "compile": _args("enforce_eager", lambda job, rec: job.cell.compile != "on"),
        "concurrency": _args("max_num_seqs", lambda job, rec: default_max_num_seqs(
            job.device, int(job.cell.tensor_parallel)) if job.cell.concurrency == "default" else int(job.cell.concurrency)),
        "batch_invariant": Proof("engine.env.VLLM_BATCH_INVARIANT",
                                 lambda job, rec: "1" if job.cell.batch_invariant == "on" else "0"),
        "tensor_parallel": _args("tensor_parallel_size", lambda job, rec: int(job.cell.tensor_parallel)),
    }
    why = {
        "batch_size": "vLLM schedules its own batches from the requests in flight (use the concurrency axis)",
        "intervention": "interventions patch a transformers model's modules",
        "attention": "vLLM chooses its own attention backend (recorded with each cell)",
        "deterministic": "torch's deterministic algorithms do not reach vLLM's kernels (use batch_invariant)",
        "cache_impl": "vLLM's KV cache is its own paged cache",
    }
    # What vLLM's own knobs change in a cell's record, beyond the cell spec.
    axis_provenance = {axis: ("engine.args", "engine.env", "engine.prefix_cache", "environment.device")
                       for axis in ("concurrency", "prefix_cache", "prefill_chunk", "kv_dtype", "compile",
                                    "batch_invariant", "tensor_parallel", "threads")}
    axis_provenance["decoding"] = ("engine.sampling",)

    def unavailable(self) -> str | None:
        info = installed()
        if "error" in info:
            return f"engine 'vllm' needs vLLM's own environment: {info['error']}; {_INSTALL}"
        if not ({"vllm", "vllm-cpu"} & set(info)):
            return f"engine 'vllm': {python()} has no vllm installed; {_INSTALL}"
        return None

    def grid_problems(self, config, grid, where, defaults) -> Iterator[str]:
        info = installed()
        device = build_device()

        def values(axis):
            return [str(v) for v in grid_values(grid, axis, defaults)]

        if "off" in values("cache"):
            yield (f"{where}: engine 'vllm' with cache 'off': vLLM always decodes against its paged KV cache "
                   f"(compare the cache on and off in the transformers or llama.cpp engine)")
        for kv in values("kv_dtype"):
            if kv not in ("default", *KV_DTYPES):
                yield f"{where}: engine 'vllm' with kv_dtype {kv!r}: vLLM's KV cache stores {', '.join(KV_DTYPES)}"
            elif kv in KV_DTYPES and device == "cpu" and (problem := fp8_cache_problem(cpu_flags())):
                yield f"{where}: engine 'vllm' with kv_dtype {kv!r}: {problem}"
        for dev in values("device"):
            if device and dev in ("cpu", "cuda") and dev != device:
                yield (f"{where}: engine 'vllm' with device {dev!r}: the installed vLLM build "
                       f"({', '.join(f'{k} {v}' for k, v in info.items() if 'vllm' in k)}) runs on {device}")
        threads = [int(t) for t in values("threads") if t != "default"]
        if device == "cpu":
            cores = len(os.sched_getaffinity(0))
            for t in threads:
                if t > cores:
                    yield (f"{where}: engine 'vllm' with threads {t}: vLLM's CPU build binds one thread to each core, "
                           f"and this machine gives the job {cores}")
            if "on" in values("batch_invariant"):
                yield (f"{where}: engine 'vllm' with batch_invariant 'on': vLLM's batch-invariant mode "
                       f"(VLLM_BATCH_INVARIANT) has kernels for CUDA only, and this vLLM is a CPU build")
            for tp in values("tensor_parallel"):
                if tp != "1":
                    yield (f"{where}: engine 'vllm' with tensor_parallel {tp}: a CPU build runs one model "
                           f"replica over this machine's cores (tensor parallelism splits a model over devices)")
        elif device == "cuda":
            if threads:
                yield (f"{where}: engine 'vllm' with threads {threads[0]}: threads are the cores vLLM's CPU build "
                       f"computes on; this vLLM is a CUDA build")
            have = cuda_devices()
            for tp in values("tensor_parallel"):
                if have is not None and int(tp) > have:
                    yield (f"{where}: engine 'vllm' with tensor_parallel {tp}: this machine has {have} CUDA "
                           f"device(s)")
        if device == "cpu":
            from tokenflip.models.size import random_model_config

            for model in grid.get("models", list(config["models"])):
                spec = config["models"][model]
                if spec["source"] == "random":
                    problem = head_size_problem(random_model_config(spec))
                    if problem:
                        yield f"{where}: engine 'vllm' with model {model!r}: {problem}"
        # The most requests in flight any cell of the grid asks for (vLLM's default where unset).
        seqs, most = max((DEFAULT_MAX_NUM_SEQS if c == "default" else int(c), c) for c in values("concurrency"))
        for chunk in values("prefill_chunk"):
            if chunk != "default" and int(chunk) < seqs:
                yield (f"{where}: engine 'vllm' with prefill_chunk {chunk} and concurrency {most}: vLLM requires "
                       f"max_num_batched_tokens >= max_num_seqs (its default max_num_seqs is "
                       f"{DEFAULT_MAX_NUM_SEQS}; set the concurrency axis)")

    def job_device(self, cell, configured: str) -> str:
        return build_device() or configured

    def job_threads(self, cell, configured: int, cores: int) -> int:
        # On a CPU vLLM binds its OpenMP threads to cores: the job holds every core it was
        # given, so no other job shares the cores it binds.
        return cores if self.job_device(cell, "cpu") == "cpu" else configured

    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:
        return decode_vllm(job, bench, model_dir)


def engine_args(cell, max_model_len: int, record_top_k: int, seed: int) -> dict[str, Any]:
    """vLLM's engine arguments for a cell: every argument that can change a number is set,
    the rest stay vLLM's defaults (the resolved values are recorded with the cell)."""
    args: dict[str, Any] = {
        "dtype": DTYPES[cell.precision], "seed": seed, "max_model_len": max_model_len,
        "logprobs_mode": "raw_logits", "max_logprobs": record_top_k,
        "enforce_eager": cell.compile != "on",
        "enable_prefix_caching": cell.prefix_cache != "off",
        "tensor_parallel_size": int(cell.tensor_parallel),
        "disable_log_stats": True,
    }
    if cell.concurrency != "default":
        args["max_num_seqs"] = int(cell.concurrency)
    if cell.prefill_chunk != "default":
        args["enable_chunked_prefill"] = True
        args["max_num_batched_tokens"] = int(cell.prefill_chunk)
    if cell.kv_dtype != "default":
        args["kv_cache_dtype"] = cell.kv_dtype
    return args


def engine_env(job, device: str) -> dict[str, str]:
    """The variables vLLM reads at start: batch invariance, and on a CPU the cores its
    OpenMP threads bind to (the first `threads` of this job's CPU set: the cell's, else the
    run's; else all but the one vLLM reserves for its own processes) and its KV cache size."""
    env = {"VLLM_BATCH_INVARIANT": "1" if job.cell.batch_invariant == "on" else "0"}
    if device == "cpu":
        cores = sorted(os.sched_getaffinity(0))
        if job.threads:
            cores = cores[:int(job.threads)]
        elif len(cores) > 1:
            cores = cores[:-1]
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        # One OpenMP thread per bound core, whatever the job inherited (Snakemake sets
        # OMP_NUM_THREADS to the job's threads): more threads than bound cores run slower and
        # split the reductions otherwise, so the logits would depend on the scheduler.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(len(cores))
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    return env


def sampling_of(decoding: dict[str, Any]) -> dict[str, Any]:
    """vLLM's sampling parameters for a decoding spec (greedy: temperature 0)."""
    if decoding["strategy"] == "greedy":
        return {"temperature": 0.0}
    out = {"temperature": float(decoding.get("temperature", 1.0))}
    if decoding.get("top_k"):
        out["top_k"] = int(decoding["top_k"])
    if decoding.get("top_p") is not None:
        out["top_p"] = float(decoding["top_p"])
    return out


def request(job, bench, model_dir, tokenizer, eos: list[int]) -> dict[str, Any]:
    """The worker's request: the prompt ids exactly as the other engines encode them."""
    from tokenflip.run import runtime
    from tokenflip.run.sampling import prompt_seed

    items = bench.items()
    prompts = [runtime.encode_prompt(tokenizer, bench, item) for item in items]
    greedy = job.decoding["strategy"] == "greedy"
    return {
        "model": str(Path(model_dir).resolve()),
        "engine_args": engine_args(job.cell, max(map(len, prompts)) + job.max_new_tokens, job.record_top_k,
                                   job.run_seed),
        "top_k": job.record_top_k, "prompts": prompts, "max_tokens": job.max_new_tokens,
        "sampling": sampling_of(job.decoding),
        # Sampling draws from one seed per prompt, derived as the other engines derive theirs.
        "seeds": [None if greedy else prompt_seed(job.run_seed, item.id) for item in items],
        "stop": list(bench.stop), "stop_token_ids": list(eos),
        "warm_prefix_cache": job.cell.prefix_cache == "on",
        "env_keys": list(ENV_KEYS),
    }


def call_worker(req: dict[str, Any], env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Run the worker in vLLM's environment (the out-of-process engines' protocol,
    `worker.call`); its log goes to this job's log. The response holds its timing: wall and
    CPU seconds of vLLM's processes (the worker measures its process tree, whose engine
    processes are killed at shutdown and never reaped here)."""
    interpreter = python()
    if interpreter is None:
        raise VllmError(f"engine 'vllm': no vLLM environment found; {_INSTALL}")
    try:
        return worker.call(interpreter, WORKER, req, env, scratch, "engine 'vllm'")
    except worker.WorkerError as exc:
        raise VllmError(str(exc)) from None


def prefix_cache_record(cell, prompts: list[list[int]], response: dict[str, Any]) -> dict[str, Any]:
    """How much of the prompts the prefix cache served; a cell that asked for a warm cache
    and hit nothing is refused (its prompts are shorter than one of vLLM's blocks)."""
    cached = [int(r["cached_tokens"]) for r in response["outputs"]]
    record = {"mode": cell.prefix_cache, "cached_tokens": sum(cached), "prompt_tokens": sum(map(len, prompts)),
              "prompts_hit": sum(1 for c in cached if c > 0), "prompts": len(cached),
              "block_size": response["engine"]["args"]["block_size"]}
    if cell.prefix_cache == "on" and not any(cached):
        raise VllmError(f"engine 'vllm': prefix_cache 'on' but no prompt hit the warmed cache: vLLM caches whole "
                        f"blocks of {record['block_size']} tokens and the longest prompt has "
                        f"{max(map(len, prompts))} (use longer prompts, e.g. more shots)")
    return record


def decode_vllm(job, bench, model_dir) -> Decoded:
    """The cell through vLLM: prompts encoded here, decoded by the worker in vLLM's
    environment; the runner scores, checks and writes it as every engine's cell."""
    import torch
    from transformers import GenerationConfig

    from tokenflip.models.prepare import load_tokenizer, read_manifest, verify_prepared, weights_record
    from tokenflip.run import runtime
    from tokenflip.run.cell_output import model_record
    from tokenflip.run.decode import BatchResult
    from tokenflip.run.engines.base import DecodedBatch

    manifest = read_manifest(model_dir)
    verify_prepared(model_dir, manifest)  # vLLM reads the files itself: they must be the ones recorded
    tokenizer = load_tokenizer(model_dir)
    eos, pad = runtime.special_ids(GenerationConfig.from_pretrained(str(model_dir)), tokenizer)
    device = build_device()
    problem = head_size_problem(json.loads((Path(model_dir) / "config.json").read_text())) if device == "cpu" else None
    if problem:
        raise VllmError(f"engine 'vllm': model {job.cell.model!r} cannot run in vLLM's CPU build: {problem}")
    req = request(job, bench, model_dir, tokenizer, eos)
    env = engine_env(job, device)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tokenflip-vllm.") as tmp:
        response = call_worker(req, env, Path(tmp))
    wall = time.perf_counter() - start
    check_resolved(req["engine_args"], response["engine"]["args"])
    gens = generations(response, job.record_top_k)
    # Every prompt is one request of one submission: one batch, timed as a whole.
    result = BatchResult(gens, response["timing"]["generate_s"], max((len(g.token_ids) for g in gens), default=0))
    batches = [DecodedBatch(bench.items(), req["prompts"], result, response["timing"]["generate_cpu_s"])]
    record = {
        "model": {**model_record(manifest), "weights": weights_record(manifest, job.cell.precision)},
        "cache_form": {"impl": "vllm"},  # vLLM's paged cache (its settings: engine.args)
        "engine": {**response["engine"], "use_cache": True,  # vLLM always decodes against its paged cache
                   "prefix_cache": prefix_cache_record(job.cell, req["prompts"], response),
                   "n_threads": len(env["VLLM_CPU_OMP_THREADS_BIND"].split(",")) if device == "cpu" else None},
        "engine_timing": {"start_seconds": response["timing"]["start_s"],
                          "warm_seconds": response["timing"]["warm_s"], "job_wall_seconds": wall,
                          "vllm_cpu_seconds": response["timing"]["total_cpu_s"]},
    }
    # tokenflip's own process (prompts, scoring) ran on the CPU; where vLLM ran is engine.platform.
    return Decoded(batches, tokenizer, eos, pad, torch.device("cpu"), record, unrecorded=("logsumexp", "entropy"))
