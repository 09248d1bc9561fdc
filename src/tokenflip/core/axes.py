"""The axes of a study, one entry each: the one table every other place derives from.

An entry owns everything about its axis: its name, the value a grid takes when it does not
set it, the JSON Schema of one value (and so how a YAML value is read: on/off words, an
integer), its form in cell names and its words in the report, how its value reaches the job
(the cell, or a resolved job field such as `threads`), the provenance a value of it may
change between two compared cells, and the record that proves a cell ran with it (`proof`;
an engine may declare its own, `engines.base.Engine.proofs`). Which engines honour an axis
is the engines' own allow list (`Engine.honours`): adding an axis is one entry here plus
the engines that honour it; the config schema, the plan, cell names and their pattern in the
Snakefile, pairs, comparability and report labels all read this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

# A proof: the dotted provenance field an engine records, and what a cell's job says it
# must hold there (None: the job asks nothing of it, e.g. `threads: default`).
Expect = Callable[[Any, dict], Any]


@dataclass(frozen=True)
class Proof:
    field: str
    expect: Expect


@dataclass(frozen=True)
class Axis:
    name: str
    items: dict[str, Any]  # JSON Schema of one grid value
    words: str  # what the axis is, for a reader
    description: str = ""
    # The value of a grid that does not set the axis; None: every grid must set it.
    default: Any = None
    # Core axes are always in a cell's name, in table order; further axes appear as
    # `-axis=value` only away from their default, so adding one renames no existing cell.
    core: bool = False
    prefix: str = ""  # the value's prefix in a cell name ("bs" for batch sizes)
    integer: bool = False  # cells hold an int (else the value's text)
    on_off: bool = False  # YAML 1.1 reads bare on/off as booleans: they mean the words
    # The value a cell has "when nothing is varied" (report filters); None: the default.
    plain: Any = None
    # Provenance fields (dotted prefixes) a value of this axis legitimately changes in a
    # cell's record beyond the cell spec (`compare` lets them differ on this axis only).
    provenance: tuple[str, ...] = ()
    # What proves a cell ran with its value, where all engines record it alike.
    proof: Proof | None = None
    # Why no record can prove this axis (it changes nothing but the cell's name).
    unprovable: str = ""
    # A non-default value, for tests built from this table.
    example: Any = None
    # Written in a cell's record and job only away from its default: an axis added after
    # cells exist changes none of them (their jobs and records stay byte for byte what they
    # were, so Snakemake reruns nothing and the summary takes them as they are).
    recorded_only_when_set: bool = False

    def value(self, raw: Any) -> Any:
        """The one form of a value in cells, pairs and checks (batch size an int, the rest
        text: threads 2 -> "2", the form file names use)."""
        return int(raw) if self.integer else str(raw)

    @property
    def grid_default(self) -> Any:
        return None if self.default is None else self.value(self.default)


def _enum(*values: Any) -> dict[str, Any]:
    return {"enum": list(values)}


def _int_or_default(maximum: int, minimum: int = 1) -> dict[str, Any]:
    return {"oneOf": [{"type": "integer", "minimum": minimum, "maximum": maximum}, {"const": "default"}]}


def _label() -> dict[str, Any]:
    return {"$ref": "#/$defs/label"}


def _unless_default(value: Any, then: Callable[[Any], Any]) -> Any:
    return None if value == "default" else then(value)


AXES_LIST: tuple[Axis, ...] = (
    Axis("precision", _enum("fp32", "bf16", "fp16"), "precision", core=True,
         # The dtype a cell loads the stored weights in follows its precision.
         provenance=("model.weights",), example="fp16"),
    Axis("cache", _enum("on", "off"), "KV cache", core=True, on_off=True, plain="on",
         proof=Proof("engine.use_cache", lambda job, rec: job.cell.cache == "on"), example="off"),
    Axis("batch_size", {"type": "integer", "minimum": 1, "maximum": 4096}, "batch size", core=True, prefix="bs",
         integer=True, plain=1,
         # The largest batch a cell decoded: its batch size, or every prompt where fewer.
         proof=Proof("observed.largest_batch", lambda job, rec: min(job.cell.batch_size, rec["observed"]["prompts"])),
         example=2),
    Axis("decoding", _label(), "decoding", default="greedy", core=True,
         provenance=("settings.decoding",),
         proof=Proof("observed.selector", lambda job, rec: job.decoding["strategy"]), example="sampled"),
    Axis("intervention", _label(), "intervention", default="none", core=True,
         # Interventions that load fp32 weights change the weights' record.
         provenance=("settings.intervention", "model.weights"),
         proof=Proof("engine.intervention", lambda job, rec: job.intervention.get("kind", "none")),
         example="gated"),
    Axis("attention", _enum("default", "eager", "sdpa", "flash_attention_2"), "attention kernel",
         description="attention implementation (transformers attn_implementation); default = the library's choice",
         default="default",
         proof=Proof("engine.attn_implementation", lambda job, rec: _unless_default(job.cell.attention, str)),
         example="eager"),
    Axis("threads", _int_or_default(1024), "CPU threads",
         description="CPU threads the engine computes with; default = generation.threads, else what the scheduler "
                     "gives the job",
         default="default", provenance=("settings.threads", "environment.device.threads"),
         proof=Proof("environment.device.threads", lambda job, rec: job.threads), example=2),
    Axis("device", _enum("default", "cpu", "cuda"), "device",
         description="where the engine computes; default = generation.device",
         default="default", provenance=("settings.device", "environment.device"),
         proof=Proof("environment.device.type", lambda job, rec: None if job.device == "auto" else job.device),
         example="cpu"),
    Axis("deterministic", _enum("default", "on", "off"), "deterministic algorithms",
         description="torch.use_deterministic_algorithms on or off; default = torch's default (off)",
         default="default", on_off=True, provenance=("environment.determinism",),
         proof=Proof("environment.determinism.deterministic_algorithms",
                     lambda job, rec: _unless_default(job.cell.deterministic, lambda v: v == "on")),
         example="on"),
    Axis("repeat", _int_or_default(1000, 2), "the same cell run again",
         description="run the same cell again under another name (default, 2, 3, ...), to test run-to-run "
                     "determinism",
         default="default", example=2,
         unprovable="a repeat runs the same cell again: only its name differs (arXiv 2609.26621 §6.1)"),
    Axis("prefill_chunk", _int_or_default(1048576), "chunked prefill",
         description="the prompt prefilled N tokens at a time through the cache (generate's prefill_chunk_size); "
                     "default = in one forward",
         default="default", provenance=("cache_form",),
         proof=Proof("cache_form.prefill_chunk", lambda job, rec: _unless_default(job.cell.prefill_chunk, int)),
         example=16),
    Axis("prefix_cache", _enum("off", "on", "cold"), "prefix caching",
         description="on: every prompt starts from a warm prefix cache (transformers: the longest prefix all "
                     "prompts share, computed once; vLLM: enable_prefix_caching after one pass over the same "
                     "prompts); cold (vLLM): prefix caching on, filled as requests arrive",
         default="off", on_off=True, provenance=("cache_form",),
         proof=Proof("cache_form.prefix_cache", lambda job, rec: job.cell.prefix_cache == "on"), example="on"),
    Axis("kv_dtype", _enum("default", "fp8_e4m3", "fp8_e5m2", "int4", "int8"), "KV cache storage format",
         description="storage format of the cached keys and values (transformers' QuantizedCache backends); "
                     "default = the cell's precision",
         default="default", provenance=("cache_form",),
         proof=Proof("cache_form.kv_dtype", lambda job, rec: job.cell.kv_dtype), example="int8"),
    Axis("cache_impl", _enum("dynamic", "static"), "KV cache implementation",
         description="dynamic (DynamicCache) or static (StaticCache, generate(cache_implementation='static'))",
         default="dynamic", provenance=("cache_form",),
         proof=Proof("cache_form.impl", lambda job, rec: job.cell.cache_impl), example="static"),
    Axis("compile", _enum("off", "on"), "compiled forward pass",
         description="on: decode steps through the model's torch.compile'd call (inductor), as generate() compiles "
                     "with a static cache",
         default="off", on_off=True, provenance=("cache_form",),
         proof=Proof("cache_form.compiled", lambda job, rec: job.cell.compile == "on"), example="on"),
    Axis("engine", {"description": "filled in from tokenflip.run.engines.ENGINES"}, "inference engine",
         description="the inference engine: transformers (tokenflip's decode loop), llama.cpp (the model's GGUF "
                     "through llama-cpp-python), vllm (vLLM's offline LLM API in its own environment), or the "
                     "name of a live OpenAI-compatible server under `endpoints`",
         default="transformers",
         # Another engine reads the same model's GGUF (its weights recorded as such), caches in
         # its own way, records its own version and build, and runs where it can.
         # Engines compute where their builds run (settings.device: llama.cpp on the CPU beside a
         # transformers cell on a GPU) and batch as they do (vLLM takes every prompt at once).
         provenance=("engine", "model.weights", "cache_form", "environment.device", "settings.device", "observed",
                     "settings.endpoint"),
         proof=Proof("engine.name", lambda job, rec: job.cell.engine), example="llama.cpp"),
    Axis("concurrency", _int_or_default(65536), "requests in flight",
         description="a serving engine's requests in flight (vLLM: max_num_seqs, every prompt submitted "
                     "together; a live endpoint: the requests tokenflip's client keeps in flight); "
                     "default = the engine's own (an endpoint: one at a time)",
         default="default", example=8),
    Axis("load", _label(), "background load",
         description="a live endpoint's background load: a label under `loads` (other requests kept in flight "
                     "while the cell's own run); none = no other requests from tokenflip",
         default="none", provenance=("settings.load",),
         proof=Proof("traffic.background.most_in_flight", lambda job, rec: (job.load or {}).get("requests", 0)),
         example="busy"),
    Axis("order", _enum("given", "reversed", "shuffled"), "request order",
         description="the order a live endpoint's requests are sent in: the benchmark's, reversed, or shuffled "
                     "with the run's seed (what a request's neighbours and the server's history are)",
         default="given",
         proof=Proof("traffic.order", lambda job, rec: job.cell.order), example="reversed"),
    Axis("logprobs", _enum("on", "off"), "logprobs requested",
         description="whether a live endpoint is asked for each step's top-k logprobs (off: text and ids only, "
                     "the observer effect)",
         default="on", on_off=True, provenance=("engine.scores",),
         proof=Proof("engine.logprobs_returned", lambda job, rec: job.cell.logprobs == "on"), example="off"),
    Axis("server_cache", _enum("as_is", "cold", "warm"), "the server's prefix cache",
         description="what a live endpoint's prefix cache holds of a prompt when it is sent: as_is = whatever "
                     "the server's traffic left; cold = nothing (a fresh cache_salt per request: vLLM); warm = "
                     "the prompt itself (each request sent once before the one recorded)",
         default="as_is", provenance=("engine.server_cache", "engine.warming_requests", "engine.cache_salt"),
         proof=Proof("engine.server_cache", lambda job, rec: job.cell.server_cache),
         example="warm", recorded_only_when_set=True),
    Axis("batch_invariant", _enum("off", "on"), "batch-invariant kernels",
         description="vLLM: on = VLLM_BATCH_INVARIANT=1 (batch-invariant kernels; CUDA only)",
         default="off", on_off=True, example="on"),
    Axis("tensor_parallel", {"type": "integer", "minimum": 1, "maximum": 64}, "devices the model is split over",
         description="vLLM: tensor_parallel_size, the devices one model is split over",
         default=1, example=2),
)

AXES: dict[str, Axis] = {axis.name: axis for axis in AXES_LIST}
CORE_AXES = tuple(a.name for a in AXES_LIST if a.core)
# Further axes and their defaults, in cell-name order.
FURTHER_AXES = {a.name: a.grid_default for a in AXES_LIST if not a.core}
ALL_AXES = tuple(AXES)
# What a grid takes where it does not set an axis (precision, cache and batch size: none).
GRID_DEFAULTS = {a.name: a.grid_default for a in AXES_LIST if a.default is not None}
ON_OFF_AXES = tuple(a.name for a in AXES_LIST if a.on_off)
REQUIRED_AXES = tuple(a.name for a in AXES_LIST if a.default is None)


def axis(name: str) -> Axis:
    try:
        return AXES[name]
    except KeyError:
        raise KeyError(f"unknown axis {name!r}; known: {', '.join(AXES)}") from None


def axis_value(name: str, value: Any) -> Any:
    """The one form of an axis value (see `Axis.value`)."""
    return AXES[name].value(value)


def grid_schema(name: str) -> dict[str, Any]:
    """A grid's list of values of one axis, as the config schema takes it."""
    a = AXES[name]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "uniqueItems": True, "items": dict(a.items)}
    if a.description:
        schema["description"] = a.description
    return schema


def cell_name_pattern(label: str = r"[A-Za-z0-9_.]+") -> str:
    """The regular expression every cell file name matches (the Snakefile's wildcard)."""
    core = []
    for a in AXES_LIST:
        if not a.core:
            continue
        values = a.items.get("enum")
        if a.integer:
            core.append(re.escape(a.prefix) + r"\d+")
        elif values:
            core.append("(" + "|".join(re.escape(str(v)) for v in values) + ")")
        else:
            core.append(label)
    further = "|".join(re.escape(n) for n in FURTHER_AXES)
    return "-".join(core) + rf"(-({further})={label})*"
