"""Benchmarks: the prompts a run generates from and the scorers for their completions."""

from __future__ import annotations

from typing import Any

from .answers import answers_match, extract_answer, normalize_answer
from .arithmetic import ArithmeticBenchmark
from .base import MATH_SYSTEM_PROMPT, Benchmark, BenchmarkError, Item, MathBenchmark
from .gsm8k import GSM8KBenchmark

__all__ = [
    "BenchmarkError",
    "Item",
    "Benchmark",
    "MathBenchmark",
    "ArithmeticBenchmark",
    "GSM8KBenchmark",
    "KNOWN_KINDS",
    "MATH_SYSTEM_PROMPT",
    "build_benchmark",
    "extract_answer",
    "normalize_answer",
    "answers_match",
]

KNOWN_KINDS: tuple[str, ...] = ("arithmetic", "gsm8k")

_SOURCE_KEYS = {"path"}, {"hub", "config", "split", "revision"}


def _check_keys(name: str, where: str, got: dict, allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise BenchmarkError(f"benchmark {name!r}: unknown {where} key(s) {unknown}; allowed: {sorted(allowed)}")


def _gsm8k_source(name: str, source: Any) -> dict:
    if source is None:
        return {}
    if not isinstance(source, dict):
        raise BenchmarkError(f"benchmark {name!r}: source must be a mapping, got {source!r}")
    path_keys, hub_keys = _SOURCE_KEYS
    _check_keys(name, "source", source, path_keys | hub_keys)
    if "path" in source and set(source) & hub_keys:
        raise BenchmarkError(f"benchmark {name!r}: source gives both a path and hub keys; choose one")
    return dict(source)


def build_benchmark(name: str, spec: dict) -> Benchmark:
    """Build the benchmark a config entry describes, e.g. {"kind": "arithmetic", "n": 16, "seed": 0}."""
    if not isinstance(spec, dict):
        raise BenchmarkError(f"benchmark {name!r}: spec must be a mapping, got {spec!r}")
    kind = spec.get("kind")
    if kind == "arithmetic":
        _check_keys(name, "spec", spec, {"kind", "n", "seed"})
        return ArithmeticBenchmark(name, n=spec.get("n", 16), seed=spec.get("seed", 0))
    if kind == "gsm8k":
        _check_keys(name, "spec", spec, {"kind", "n", "source"})
        return GSM8KBenchmark(name, n=spec.get("n"), **_gsm8k_source(name, spec.get("source")))
    raise BenchmarkError(f"benchmark {name!r}: unknown kind {kind!r}; known kinds: {', '.join(KNOWN_KINDS)}")
