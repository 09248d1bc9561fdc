"""What a live endpoint is and what it did: its identity (the model list, the version where it
tells, fingerprints and the `server` header of its answers), the check before any job that
it answers and serves the model the config names, the background prompts of a load, and
the findings of a cell (steps where a greedy server chose another token than its own top
score, ids that do not spell the server's text, prompts the server counted otherwise).
"""

from __future__ import annotations

import random
from typing import Any, Callable

from tokenflip.core.excerpt import excerpt

# Fields of a model list entry that say what is served (others, such as `created` or a
# permission's id, change from one call to the next).
MODEL_ENTRY_FIELDS = ("id", "object", "owned_by", "root", "parent", "max_model_len")
# Answer headers that say which server and version answered.
IDENTITY_HEADERS = ("server", "x-powered-by", "openai-version", "x-request-model", "via")


def served_models(spec: dict[str, Any], timeout: float = 10.0) -> tuple[list[dict[str, Any]] | None, str]:
    """The server's model list (None if it does not answer one), and what answered."""
    from tokenflip.core.bounded_http import fetch_json
    from tokenflip.run.engines.endpoint.client import api_key

    url = spec["url"].rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key(spec)}"} if spec.get("api_key_env") else {}
    try:  # within core.bounded_http's bounds: a listing is small
        status, answer, text = fetch_json("GET", url, headers=headers, timeout=timeout)
    except Exception as exc:  # any transport failure, or more than a model list can be: nothing answered
        return None, f"nothing answers at {url} ({type(exc).__name__}: {excerpt(exc, 200)})"
    if status != 200:
        return None, f"{url} answered {status}: {excerpt(text, 200)}"
    data = answer.get("data") if isinstance(answer, dict) else None
    if not (isinstance(data, list) and all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data)):
        return None, f"{url} answered 200 with no model list: {excerpt(text, 200)}"
    return [bounded(m) for m in data], f"{url} lists {', '.join(excerpt(m['id'], 80) for m in data[:50])}"


# The longest string of a server's self-description kept.
LONGEST_FIELD = 512


def bounded(value: Any, depth: int = 0) -> Any:
    """`value` as a record keeps it: strings cut at LONGEST_FIELD characters, at most 50 items
    a list or mapping, 4 levels deep (a server's self-description is recorded, never its bulk)."""
    if isinstance(value, str):
        return value if len(value) <= LONGEST_FIELD else value[:LONGEST_FIELD] + f"… ({len(value):,} characters)"
    if depth >= 4:
        return "…"
    if isinstance(value, dict):
        return {bounded(str(k)): bounded(v, depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list):
        return [bounded(v, depth + 1) for v in value[:50]]
    return value


def problem(name: str, spec: dict[str, Any]) -> str | None:
    """Why endpoint `name` cannot serve its cells now (None if it can): nothing answers, or
    it serves another model. Checked before any job runs."""
    try:
        models, answered = served_models(spec)
    except Exception as exc:  # an unset API key variable, say
        return f"endpoint {name!r}: {exc}"
    if models is None:
        return f"endpoint {name!r} ({spec['url']}): {answered}"
    if spec["model"] not in [m["id"] for m in models]:
        return f"endpoint {name!r} ({spec['url']}) does not serve model {spec['model']!r}: {answered}"
    return None


def endpoint_problems(config: dict[str, Any], cells, model_dir: Callable[[str], str] | None = None) -> list[str]:
    """`problem` of every endpoint one of `cells` names (each endpoint asked once), then, for
    each endpoint that answers, whether each model its cells encode with has the served
    model's tokenizer (`tokenizer.mismatch`; the prepared copy's where `model_dir(name)`
    holds one, else the model entry's own, no weight read)."""
    from tokenflip.run.engines.endpoint.tokenizer import label_of, mismatch

    endpoints = config.get("endpoints", {})
    names = dict.fromkeys(cell.engine for cell in cells if cell.engine in endpoints)
    found = {name: problem(name, endpoints[name]) for name in names}
    problems = [p for p in found.values() if p]
    tokenizers: dict[str, Any] = {}
    for name, model in dict.fromkeys((cell.engine, cell.model) for cell in cells if cell.engine in names):
        if found[name] is not None:
            continue
        label = label_of(model, config["models"][model])
        if model not in tokenizers:
            try:
                tokenizers[model] = tokenizer_of(config["models"][model], model_dir and model_dir(model))
            except Exception as exc:  # noqa: BLE001 - a hub without network, a gated repository: said in one line
                tokenizers[model] = None
                problems.append(f"{label}: its tokenizer cannot be loaded to check it against endpoint {name!r} "
                                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
        if tokenizers[model] is not None and (why := mismatch(endpoints[name], tokenizers[model], label, name)):
            problems.append(why)
        problems += _unrendered(config, cells, name, model, tokenizers[model], label)
    return problems


def _unrendered(config: dict[str, Any], cells, name: str, model: str, tokenizer, label: str) -> list[str]:
    """A chat benchmark sent as a completion needs its chat template rendered here; a
    server's tokenizer without a route that renders it (llama-cpp-python's) cannot."""
    spec = config["endpoints"][name]
    if tokenizer is None or not hasattr(tokenizer, "chat_ids") or tokenizer.chat_template or spec["api"] == "chat":
        return []
    chat = sorted({c.benchmark for c in cells if c.engine == name and c.model == model
                   and config["benchmarks"][c.benchmark].get("format", "chat") == "chat"})
    return [f"endpoint {name!r} (api completions) with model {model!r}: {label} renders no chat prompt for a client, "
            f"so benchmark(s) {chat} (format chat) cannot be sent as completions; use `api: chat` (the server's own "
            f"template) or `format: bare`"] if chat else []


def tokenizer_of(spec: dict[str, Any], prepared: str | None = None):
    """A model entry's tokenizer: its prepared copy's where that was prepared from this very
    entry (a copy of an earlier entry under the same name is replaced before any cell reads
    it, so it is not the one to check), else its source's (no weight read)."""
    import json
    import os

    from tokenflip.models.prepare import MANIFEST, RANDOM_TOKENIZER, _load_tokenizer, load_tokenizer

    manifest = os.path.join(prepared, MANIFEST) if prepared else None
    if manifest and os.path.exists(manifest):
        try:
            same = json.loads(open(manifest).read()).get("spec") == spec
        except (OSError, ValueError):
            same = False
        if same:
            return load_tokenizer(prepared)
    if spec.get("source") == "server":
        from tokenflip.models.served_tokenizer import connect

        return connect(spec["served_by"], spec.get("eos_token"))
    return _load_tokenizer(RANDOM_TOKENIZER if spec.get("source") == "random" else spec)


def identity(spec: dict[str, Any]) -> dict[str, Any]:
    """The served model's entry (without what changes per call) and the version the server
    reports at /version, where it has one."""
    from tokenflip.core.bounded_http import fetch_json
    from tokenflip.models.servers import root_url

    models, _ = served_models(spec)
    entry = next((m for m in models or [] if m["id"] == spec["model"]), {})
    out: dict[str, Any] = {"model_entry": {k: v for k, v in entry.items() if k in MODEL_ENTRY_FIELDS}}
    try:
        status, version, _ = fetch_json("GET", root_url(spec["url"]) + "/version", timeout=10.0)
        if status == 200 and isinstance(version, dict):
            out["version"] = bounded(version)
    except Exception:
        pass  # a server without /version, or with one larger than a version is
    return out


# Prometheus gauges whose labels are a server's start settings (vLLM's cache configuration:
# prefix caching, the KV cache's dtype, its block size), reported at /metrics.
SETTINGS_GAUGES = ("vllm:cache_config_info",)


def start_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """How the server was started, where it says so: the labels of its settings gauges at
    /metrics (vLLM, in production), its default generation settings at /props (llama.cpp's
    own server) and its configuration at /server_info (vLLM in development mode). A
    server that says none of these: {} (its settings are then only what the study states)."""
    import re

    from tokenflip.core.bounded_http import fetch, fetch_json
    from tokenflip.models.servers import root_url

    root, out = root_url(spec["url"]), {}
    try:
        status, raw = fetch("GET", root + "/metrics", timeout=10.0, largest=1 << 20)
        for line in raw.decode("utf-8", "replace").splitlines() if status == 200 else []:
            gauge = line.split("{", 1)[0]
            if gauge in SETTINGS_GAUGES:
                labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line))
                out[gauge] = bounded({k: v for k, v in labels.items() if k != "engine"})
    except Exception:
        pass  # no /metrics, or more than a page of metrics
    for route, key in (("/props", "default_generation_settings"), ("/server_info?config_format=json", "vllm_config")):
        try:
            status, answer, _ = fetch_json("GET", root + route, timeout=10.0)
            if status == 200 and isinstance(answer, dict) and key in answer:
                out[route.split("?")[0]] = bounded(answer[key])
        except Exception:
            pass  # a server without the route
    return out


def server_kind_of(spec: dict[str, Any]) -> str:
    """Which server answers, from what it says of itself: the `owned_by` of its model entry
    (each profile's in `models.servers`), or vLLM's /version; else "openai"."""
    from tokenflip.models.servers import SERVERS

    info = identity(spec)
    owner = str(info["model_entry"].get("owned_by", "")).lower()
    named = next((profile.name for profile in SERVERS.values() if owner in profile.owned_by), None)
    if named is None and "version" in info and "vllm" in str(info).lower():
        named = "vllm"
    return named or "openai"


def scores_kind_of(spec: dict[str, Any]) -> str:
    """What the server's logprob fields hold, from one short request through the API the cells
    use (`spec["api"]`, completions by default), read by that API's parser: a value above 0 is
    no logprob (vLLM started with `--logprobs-mode raw_logits`, which acts on both APIs)."""
    import asyncio
    import math

    from tokenflip.run.engines.endpoint import client, protocol

    api = protocol.api(spec.get("api", "completions"))
    body = api.probe_body(spec["model"], 2)

    async def ask():
        session = client.client(spec, 1)
        async with session:
            return await client.request(session, {**spec, "api": api.name}, body, "the probe request")

    answer = asyncio.run(ask())
    try:
        choice = api.parse(answer.body["choices"][0])
    except protocol.Malformed as exc:
        raise client.EndpointError(f"the probe request: {spec['url']} answered {exc}") from None
    values = [value for step in choice.steps for _, value in step.alternatives]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise client.EndpointError(f"the probe request: {spec['url']} answered top_logprobs that are not finite "
                                   f"numbers: {excerpt([dict(step.alternatives) for step in choice.steps])}")
    return "raw_logits" if any(v > 0 for v in values) else "logprobs"


def answered(answers) -> dict[str, Any]:
    """What the answers say of the server: its fingerprints, identity headers and the model
    names it answered as (more than one of any: a finding of its own)."""
    fingerprints = sorted({str(a.body.get("system_fingerprint")) for a in answers if a.body.get("system_fingerprint")})
    headers = {h: sorted({a.headers[h] for a in answers if h in a.headers}) for h in IDENTITY_HEADERS}
    return bounded({"system_fingerprints": fingerprints, "headers": {h: v for h, v in headers.items() if v},
                    "answered_as": sorted({str(a.body.get("model")) for a in answers})})


def background_prompts(job, tokenizer, as_ids: bool, fields: dict[str, Any]) -> Callable[[int], dict] | None:
    """The background load's n-th request: a prompt of `prompt_tokens` ids drawn from the
    vocabulary's ordinary tokens with the run's seed (as text where the server takes text),
    asking for `max_tokens` tokens."""
    if not job.load:
        return None
    if hasattr(tokenizer, "ordinary_ids"):  # a server's tokenizer names no vocabulary size
        ordinary = tokenizer.ordinary_ids()
    else:
        special = set(tokenizer.all_special_ids)
        ordinary = [i for i in range(len(tokenizer)) if i not in special]
    length, max_tokens = int(job.load["prompt_tokens"]), int(job.load["max_tokens"])
    base = {key: value for key, value in fields.items() if key not in ("logprobs", "top_logprobs", "stop")}

    def body(n: int) -> dict[str, Any]:
        rng = random.Random(f"{job.run_seed}:background:{n}")
        ids = [rng.choice(ordinary) for _ in range(length)]
        request = {**base, "max_tokens": max_tokens}
        if "messages" in fields or job.endpoint.get("api") == "chat":
            request["messages"] = [{"role": "user", "content": tokenizer.decode(ids)}]
        else:
            request["prompt"] = ids if as_ids else tokenizer.decode(ids)
        return request

    return body


def findings(items, reads, decoding: dict[str, Any], answers, prompts: list[list[int]] | None) -> dict[str, Any]:
    # `answers`, `reads` and `prompts` in the order of `items`.
    """What the server did that is not a divergence between two cells: in a greedy cell, the
    steps where it chose a token below its own top score (a penalty, a bias, a processor
    applied after the scores it reports); ids that do not spell its text; prompts whose
    length it counted otherwise than the ids tokenflip encoded."""
    greedy = decoding["strategy"] == "greedy"
    off_top = {item.id: read.off_top_steps for item, read in zip(items, reads) if greedy and read.off_top_steps}
    counted = {}
    for item, answer, ids in zip(items, answers, prompts or []):  # None: the prompt ids are not known
        usage = answer.body.get("usage") or {}
        if isinstance(usage.get("prompt_tokens"), int) and usage["prompt_tokens"] != len(ids):
            counted[item.id] = {"tokenflip": len(ids), "server": usage["prompt_tokens"]}
    return {
        "not_top_choice": {"prompts": len(off_top), "steps": off_top},
        "ids_not_spelling_text": sorted(item.id for item, read in zip(items, reads) if not read.round_trip),
        "prompt_tokens_counted_otherwise": counted,
        "fingerprints": len({a.body.get("system_fingerprint") for a in answers if a.body.get("system_fingerprint")}),
    }


def server_defaults(cell_id: str, meta: dict[str, Any]) -> str | None:
    """What a greedy endpoint cell's server did beyond its numerics, in a clause a verdict
    carries (None if nothing): the prompts where it chose a token below its own top score
    at temperature 0, a default of the server's (a repetition penalty, a logit bias)
    applied after the scores it reports."""
    off_top = ((meta.get("findings") or {}).get("not_top_choice") or {}).get("prompts") or 0
    if not off_top:
        return None
    server = (meta.get("engine") or {}).get("server_kind") or "the server"
    prompts = (meta.get("observed") or {}).get("prompts")
    return (f"{cell_id} ({server}) chose a token below its own top score at temperature 0 in {off_top}"
            + (f" of {prompts}" if prompts else "") + " prompts")


def summary_columns(meta: dict[str, Any]) -> dict[str, Any]:
    """A cell's endpoint figures for the summary's cells table (None for other engines): what
    the client held in flight, what the scores are, where ids came from, whose chat template
    made the prompts, the findings, and what the server said it is (its model entry's id and
    `max_model_len`, and the `system_fingerprint`s of its answers, which change with its
    build or configuration)."""
    engine = meta.get("engine") or {}
    endpoint = engine.get("kind") == "endpoint"
    traffic = meta.get("traffic") or {}
    found = meta.get("findings") or {}
    off_top = (found.get("not_top_choice") or {}).get("steps") or {}
    server = engine.get("server") or {}
    version = (server.get("version") or {}).get("version") if isinstance(server.get("version"), dict) else None
    entry = server.get("model_entry") or {}
    length = entry.get("max_model_len")
    return {
        "endpoint_server": f"{engine.get('server_kind')} {version or ''}".strip() if endpoint else None,
        "chat_template": engine.get("chat_template") if endpoint else None,
        "in_flight_mean": traffic.get("mean_in_flight") if endpoint else None,
        "in_flight_most": traffic.get("most_in_flight") if endpoint else None,
        "background_in_flight_mean": (traffic.get("background") or {}).get("mean_in_flight") if endpoint else None,
        "request_attempts": traffic.get("attempts") if endpoint else None,
        "scores": engine.get("scores", "raw_logits"),
        "ids_from": ",".join(engine.get("ids_from", [])) if endpoint else None,
        "not_top_choice_prompts": len(off_top) if endpoint else None,
        "not_top_choice_steps": "; ".join(f"{p}: {', '.join(map(str, s))}" for p, s in off_top.items())
        if endpoint else None,
        "prompts_counted_otherwise": len(found.get("prompt_tokens_counted_otherwise") or {}) if endpoint else None,
        "endpoint_model": entry.get("id") if endpoint else None,
        "endpoint_max_model_len": int(length) if endpoint and isinstance(length, (int, float)) else None,
        "endpoint_fingerprints": ", ".join(map(str, server.get("system_fingerprints") or [])) or None
        if endpoint else None,
    }
