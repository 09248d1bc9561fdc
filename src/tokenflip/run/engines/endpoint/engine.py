"""A live OpenAI-compatible endpoint as an engine: the server users deploy (vLLM, SGLang,
TGI, llama.cpp's server, Ollama), on hardware tokenflip never sees, under load the cell's
axes set. An endpoint is an entry of the config's `endpoints` (URL, served model, API kind,
the server's kind, what its logprob fields hold, the variable that holds its key, timeouts
and retries); a grid's `engine` axis names it like an engine, so a study compares an
endpoint with itself under two loads, two endpoints, or an endpoint with a local engine on
the same weights.

- Prompts are the ids every engine encodes (the model's tokenizer), sent as ids where the
  server takes them (vLLM, SGLang), else as their text; completions come back as ids
  (`responses`) with each step's top-k scores.
- Axes: `concurrency` (requests the client keeps in flight; default one), `load` (other
  requests kept in flight beside them, `loads`), `order` (given, reversed, shuffled),
  `logprobs` (on, off: the observer effect), `repeat` (the endpoint's own noise),
  `server_cache` (its prefix cache cold, warm or as left: a fresh `cache_salt` per request,
  or each request sent once before the recorded one).
- What the server did is recorded: its identity (`/v1/models`, `/version`, fingerprints,
  the `server` header), the request fields sent, the requests in flight over time, and the
  steps where a greedy cell's chosen token was not the server's top score.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import random
import time
import uuid
from typing import Any, Iterator

from tokenflip.core.axes import Proof
from tokenflip.models.servers import SERVERS, server as server_profile
from tokenflip.run.engines.base import Decoded, Engine, grid_values

# The server kinds an endpoint entry may name (`server:`): the config schema's enum and
# `audit --server` are made from the profiles (`models.servers`).
SERVER_KINDS = tuple(SERVERS)


class Endpoint(Engine):
    """One configured endpoint (`name`: its key under `endpoints`)."""

    honours = ("precision", "cache", "decoding", "repeat", "engine", "concurrency", "load", "order", "logprobs",
               "server_cache")
    proofs = {
        # A server does not say what it computes in: the precision is the one the study states
        # for it, recorded as such (docs/internals.md lists the proofs that are only stated).
        "precision": Proof("engine.precision_stated", lambda job, rec: job.cell.precision),
        # Measured by the client: the most of the cell's own requests in flight at once.
        "concurrency": Proof("traffic.most_in_flight", lambda job, rec: min(
            1 if job.cell.concurrency == "default" else int(job.cell.concurrency), rec["observed"]["prompts"])),
    }
    why = {
        "batch_size": "a server batches the requests in flight itself (use the concurrency axis)",
        "intervention": "interventions patch a transformers model's modules",
        "attention": "a server chooses its own attention kernels",
        "deterministic": "torch's deterministic algorithms do not reach a remote server",
        "threads": "a server's threads are its own (set them where it is started)",
        "device": "a server computes where it runs",
        "prefill_chunk": "a server's chunked prefill is one of its own start options",
        "prefix_cache": "a server's prefix cache is one of its own start options",
        "kv_dtype": "a server's KV cache format is one of its own start options",
        "cache_impl": "a server's KV cache is its own",
        "compile": "a server's compilation is one of its own start options",
        "batch_invariant": "a server's batch invariance is one of its own start options",
        "tensor_parallel": "a server's parallelism is one of its own start options",
    }
    axis_provenance = {"logprobs": ("engine.request", "engine.scores"),
                       "decoding": ("engine.request",)}

    def __init__(self, name: str, spec: dict[str, Any]):
        self.name = name
        self.spec = spec

    def unavailable(self) -> str | None:
        try:
            importlib.metadata.version("openai")
        except importlib.metadata.PackageNotFoundError:
            return f"endpoint {self.name!r} needs the `openai` package (requirements.lock; `make run` installs it)"
        return None

    def grid_problems(self, config, grid, where, defaults) -> Iterator[str]:
        if "off" in [str(v) for v in grid_values(grid, "cache", defaults)]:
            yield (f"{where}: endpoint {self.name!r} with cache 'off': a server decodes against its own KV cache "
                   f"(compare the cache on and off in the transformers or llama.cpp engine)")
        profile = server_profile(self.spec.get("server"))
        server = profile.name
        for label in grid_values(grid, "decoding", defaults):
            spec = config["decoding"].get(label, {})
            if spec.get("top_k") and not profile.top_k:
                yield (f"{where}: endpoint {self.name!r} with decoding {label!r}: top_k is not a field of the "
                       f"OpenAI API, and server {server!r} takes none")
        if "cold" in [str(v) for v in grid_values(grid, "server_cache", defaults)] and not profile.cache_salt:
            yield (f"{where}: endpoint {self.name!r} with server_cache 'cold': server {server!r} takes no cache_salt, "
                   f"so a request cannot be kept from its prefix cache (compare warm with as_is)")
        if self.spec.get("api") == "chat":
            for name in grid.get("benchmarks", list(config["benchmarks"])):
                if config["benchmarks"][name].get("format") == "bare":
                    yield (f"{where}: endpoint {self.name!r} (api chat) with benchmark {name!r}: a bare prompt "
                           f"is plain text, which the completions API takes (api: completions)")

    def job_device(self, cell, configured: str) -> str:
        return "cpu"  # tokenflip's own process only encodes and scores; the server computes

    def job_threads(self, cell, configured, cores: int) -> int:
        return 1

    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:
        return decode_endpoint(self, job, bench, model_dir)


def send_order(order: str, n: int, seed: int) -> list[int]:
    """The prompt indices in the order the cell sends them."""
    indices = list(range(n))
    if order == "reversed":
        return indices[::-1]
    if order == "shuffled":
        random.Random(seed).shuffle(indices)
    return indices


def observed_order(sent: list[int]) -> str:
    """Which order the indices were sent in, read from what was sent."""
    if sent == sorted(sent):
        return "given"
    return "reversed" if sent == sorted(sent, reverse=True) else "shuffled"


def request_fields(spec: dict[str, Any], decoding: dict[str, Any], max_tokens: int, k: int, logprobs: bool,
                   stop: list[str], eos: list[int]) -> dict[str, Any]:
    """The fields every request of a cell carries (a prompt's own are added per request)."""
    from tokenflip.run.engines.endpoint import protocol
    from tokenflip.run.engines.vllm_offline.engine import sampling_of

    fields: dict[str, Any] = {"model": spec["model"], "max_tokens": max_tokens, **sampling_of(decoding)}
    if stop:
        fields["stop"] = list(stop)
    if logprobs:
        fields.update(protocol.api(spec["api"]).logprob_fields(k))
    fields.update(server_profile(spec.get("server")).request_fields(list(eos)))
    fields.update(spec.get("extra_body") or {})
    return fields


def decode_endpoint(engine: Endpoint, job, bench, model_dir) -> Decoded:
    """The cell's prompts through the endpoint; the runner scores, checks and writes it."""
    import torch
    from transformers import GenerationConfig

    from tokenflip.models.prepare import load_tokenizer, read_manifest
    from tokenflip.run import runtime
    from tokenflip.run.cell_output import model_record
    from tokenflip.run.decode import BatchResult
    from tokenflip.run.engines.base import DecodedBatch
    from tokenflip.run.engines.endpoint import client, responses, server
    from tokenflip.run.engines.endpoint import tokenizer as tokenizer_check
    from tokenflip.run.engines.endpoint.answers import checked, echoes, without_logprobs
    from tokenflip.run.engines.endpoint.protocol import Malformed
    from tokenflip.run.sampling import prompt_seed

    spec, cell = engine.spec, job.cell
    refused = server.problem(engine.name, spec)
    if refused:
        raise client.EndpointError(refused)
    tokenizer = load_tokenizer(model_dir)
    if hasattr(tokenizer, "check"):  # a server's tokenizer: still the one the model was prepared from
        from tokenflip.models.served_tokenizer import ServedTokenizerError

        try:
            tokenizer.check()
        except (ServedTokenizerError, OSError) as exc:
            raise client.EndpointError(f"model {cell.model!r}: {exc}") from None
    # Checked again here: a cell run outside the pipeline, or a server swapped since it began.
    wrong = tokenizer_check.mismatch(spec, tokenizer, tokenizer_check.label_of(cell.model, job.model),
                                     engine.name)
    if wrong:
        raise client.EndpointError(wrong)
    eos, pad = runtime.special_ids(GenerationConfig.from_pretrained(str(model_dir)), tokenizer)
    items = bench.items()
    # A chat prompt the server renders and no client can (llama-cpp-python's server): its ids
    # are not known here, and recorded as none.
    unrendered = spec["api"] == "chat" and bench.prompt_style["format"] == "chat" and not tokenizer.chat_template
    prompts = [[] if unrendered else runtime.encode_prompt(tokenizer, bench, item) for item in items]
    logprobs = cell.logprobs == "on"
    fields = request_fields(spec, job.decoding, job.max_new_tokens, job.record_top_k, logprobs, list(bench.stop), eos)
    profile = server_profile(spec.get("server"))
    as_ids = profile.ids and spec["api"] == "completions"
    order = send_order(cell.order, len(items), job.run_seed)
    bodies = []
    for index in order:
        item = items[index]
        body = dict(fields)
        if spec["api"] == "chat":
            body["messages"] = bench.chat_messages(item)
        else:
            body["prompt"] = prompts[index] if as_ids else tokenizer.decode(prompts[index])
        if job.decoding["strategy"] != "greedy":
            body["seed"] = prompt_seed(job.run_seed, item.id)
        if cell.server_cache == "cold":  # no other request had this salt: nothing cached is reused
            body[profile.cache_salt] = uuid.uuid4().hex
        bodies.append((f"endpoint {engine.name!r}, prompt {item.id!r}", body))
    background = server.background_prompts(job, tokenizer, as_ids, fields)
    identity = server.identity(spec)
    if settings := server.start_settings(spec):  # a cell's record only: `server_kind_of` needs none
        identity["start_settings"] = settings
    concurrency = 1 if cell.concurrency == "default" else int(cell.concurrency)
    primed = 0
    if cell.server_cache == "warm":  # each request once before the recorded one: its prefix is cached
        asyncio.run(client.run(spec, [(f"{what} (warming)", body) for what, body in bodies], 1, None, None))
        primed = len(bodies)
    start = time.perf_counter()
    answers, traffic = asyncio.run(client.run(spec, bodies, concurrency, job.load, background))
    wall = time.perf_counter() - start
    vocabulary_size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    served = frozenset(m["id"] for m in server.served_models(spec)[0] or [])
    key = client.api_key(spec) if spec.get("api_key_env") else None
    choices = []
    for (what, body), answer in zip(bodies, answers):  # nothing of an answer is read before it is checked
        if echoes(answer, key):
            raise client.EndpointError(f"{what}: {spec['url']} answered with the API key it was sent (in its answer "
                                       f"or its headers); nothing of this cell is recorded")
        try:
            choices.append(checked(answer.body, body, spec["api"], job.record_top_k, vocabulary_size, served))
        except Malformed as wrong:
            raise client.EndpointError(f"{what}: {spec['url']} answered {wrong}; nothing of this cell is recorded") \
                from None
    if (missing := without_logprobs(choices, logprobs)) is not None:
        raise client.EndpointError(f"{bodies[missing][0]}: {spec['url']} answered no logprobs, which the cell asked "
                                   f"for and its other answers hold; nothing of this cell is recorded")
    by_index = dict(zip(order, zip(answers, choices)))
    answers, choices = ([by_index[i][j] for i in range(len(items))] for j in (0, 1))  # the benchmark's order
    vocabulary = responses.Vocabulary(tokenizer)
    eos_if_stopped = eos[0] if eos and not bench.stop else None
    reads = [responses.read(choice, job.record_top_k, tokenizer, vocabulary, eos_if_stopped) for choice in choices]
    if getattr(tokenizer, "family", None) and tokenizer.eos_token_id is None and not bench.stop:
        # A served tokenizer that names no end token (vLLM without its tokenizer info route): with
        # no stop strings a server stops only at the model's end ids, the last of each answer that
        # stopped, which its text leaves out, and so does every text decoded here.
        ends = {r.token_ids[-1] for r in reads if r.finish_reason == "stop" and r.ids_from == "server" and r.token_ids}
        if ends:
            tokenizer.learn_end_ids(ends, "the last id of each answer the server stopped")
            eos = sorted(ends)
    generations = [_generation(read) for read in reads]
    result = BatchResult(generations, wall, max((len(g.token_ids) for g in generations), default=0))
    batches = [DecodedBatch(items, prompts, result, traffic["client_cpu_seconds"])]
    manifest = read_manifest(model_dir)
    record = {
        "model": model_record(manifest),  # the tokenizer's model; the server's weights are its own
        "cache_form": {"impl": "server"},
        "engine": {
            "name": engine.name, "kind": "endpoint", "api": spec["api"], "server_kind": profile.name,
            "precision_stated": cell.precision, "use_cache": True,
            "server_cache": cell.server_cache, "warming_requests": primed,
            "cache_salt": "fresh per request" if cell.server_cache == "cold" else None,
            "server": {**identity, **server.answered(answers)},
            "request": {key: value for key, value in fields.items() if key not in ("model",)},
            "prompts_as": "ids" if as_ids else ("messages" if spec["api"] == "chat" else "text"),
            "prompt_ids": "not known (the server renders its chat template, and offers no route that shows it)"
            if unrendered else "encoded by tokenflip",
            "tokenizer": "the server's own, over HTTP" if getattr(tokenizer, "family", None) else "a local copy",
            "eos_from": tokenizer.info.get("eos_from") if getattr(tokenizer, "family", None) else "the local copy",
            # Whose chat template made the prompt: the server's own (chat API), the local tokenizer's
            # (as every local engine's), or none (bare text).
            "chat_template": "the server's" if spec["api"] == "chat" else (
                "the local tokenizer's" if bench.prompt_style["format"] == "chat" else "none (bare text)"),
            "scores": responses.scores_kind(reads, spec.get("scores", "logprobs")) if logprobs else "none",
            "logprobs_returned": any(r.top_scores.size and bool((r.top_ids >= 0).any()) for r in reads),
            "ids_from": sorted({r.ids_from for r in reads}),
            "client": {"openai": importlib.metadata.version("openai")},
        },
        "findings": server.findings(items, reads, job.decoding, answers, None if unrendered else prompts),
        "traffic": {**traffic, "order": observed_order(order), "job_wall_seconds": wall},
    }
    unrecorded = ("logsumexp", "entropy") + (() if logprobs else ("top_logits", "margin"))
    if any(r.ids_from == "text" for r in reads):
        unrecorded = tuple(dict.fromkeys((*unrecorded, "top_logits", "margin")))
    return Decoded(batches, tokenizer, eos, pad, torch.device("cpu"), record, unrecorded=unrecorded,
                   observed={"selector": job.decoding["strategy"]})


def _generation(read):
    import numpy as np

    from tokenflip.run.step_record import Generation

    steps = len(read.token_ids)
    scores = read.top_scores
    margin = (scores[:, 0] - scores[:, 1]).astype(np.float64) if steps else np.zeros(0)
    return Generation(token_ids=list(read.token_ids), top_ids=list(read.top_ids.astype(np.int32)),
                      top_logits=list(scores), margin=[float(m) for m in margin],
                      logsumexp=[float("nan")] * steps, entropy=[float("nan")] * steps,
                      intervened=[False] * steps, finish_reason=read.finish_reason)
