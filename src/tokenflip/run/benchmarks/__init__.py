"""Benchmarks: the prompts a run generates from and the scorers for their completions."""

from __future__ import annotations

from typing import Any

from tokenflip.core.registry import Registry
from tokenflip.run.benchmarks.answers import answers_match, extract_answer, normalize_answer
from tokenflip.run.benchmarks.arithmetic import ArithmeticBenchmark
from tokenflip.run.benchmarks.base import (
    COMMON_SPEC_SCHEMA,
    MATH_SYSTEM_PROMPT,
    SOURCE_SCHEMA,
    VERDICTS,
    Benchmark,
    BenchmarkError,
    Item,
    MathBenchmark,
    Score,
)
from tokenflip.run.benchmarks.coding import CodeBenchmark, extract_code
from tokenflip.run.benchmarks.gsm8k import (
    DEFAULT_CONFIG,
    DEFAULT_EXEMPLAR_SPLIT,
    DEFAULT_HUB_ID,
    DEFAULT_SPLIT,
    GSM8KBenchmark,
)
from tokenflip.run.benchmarks.humaneval import HumanEvalBenchmark
from tokenflip.run.benchmarks.math500 import Math500Benchmark
from tokenflip.run.benchmarks.math_equiv import MathAnswer, find_math_answer, last_boxed, math_equal
from tokenflip.run.benchmarks.mbpp import MBPPBenchmark
from tokenflip.run.benchmarks.onestep import OneStepBenchmark
from tokenflip.run.benchmarks.prompts_file import PromptsFileBenchmark
from tokenflip.run.benchmarks.sources import Source, parse_source
from tokenflip.run.sandbox import ExecutionResult, Layers, Limits, available_layers, run_program

__all__ = [
    "BenchmarkError",
    "Item",
    "Score",
    "VERDICTS",
    "Benchmark",
    "MathBenchmark",
    "CodeBenchmark",
    "ArithmeticBenchmark",
    "OneStepBenchmark",
    "GSM8KBenchmark",
    "HumanEvalBenchmark",
    "MBPPBenchmark",
    "Math500Benchmark",
    "PromptsFileBenchmark",
    "BENCHMARKS",
    "COMMON_SPEC_SCHEMA",
    "SOURCE_SCHEMA",
    "MATH_SYSTEM_PROMPT",
    "Source",
    "build_benchmark",
    "job_benchmark",
    "PromptBlock",
    "extract_answer",
    "normalize_answer",
    "answers_match",
    "extract_code",
    "last_boxed",
    "find_math_answer",
    "math_equal",
    "MathAnswer",
    "ExecutionResult",
    "Layers",
    "Limits",
    "available_layers",
    "run_program",
]

# The benchmark kinds a config may name: one line per kind.
BENCHMARKS: Registry[type[Benchmark]] = Registry("benchmark kind", [
    ArithmeticBenchmark,
    OneStepBenchmark,
    GSM8KBenchmark,
    HumanEvalBenchmark,
    MBPPBenchmark,
    Math500Benchmark,
    PromptsFileBenchmark,
], key="kind")


def build_benchmark(name: str, spec: dict) -> Benchmark:
    """Build the benchmark a config entry describes, e.g. {"kind": "arithmetic", "n": 16, "seed": 0}.
    The keys each kind takes are its class's `spec_schema` (see COMMON_SPEC_SCHEMA for the
    shared ones); anything else is an error naming the key."""
    if not isinstance(spec, dict):
        raise BenchmarkError(f"benchmark {name!r}: spec must be a mapping, got {spec!r}")
    kind = spec.get("kind")
    if kind not in BENCHMARKS:
        raise BenchmarkError(f"benchmark {name!r}: unknown kind {kind!r}; known kinds: {', '.join(BENCHMARKS)}")
    cls = BENCHMARKS[kind]
    allowed = set(COMMON_SPEC_SCHEMA) | set(cls.spec_schema)
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise BenchmarkError(f"benchmark {name!r}: unknown spec key(s) {unknown}; allowed: {sorted(allowed)}")
    try:
        return cls.from_spec(name, spec).configure(spec)
    except TypeError as exc:  # a value of the wrong shape reached the constructor
        raise BenchmarkError(f"benchmark {name!r} ({kind}): {exc}") from None


def job_benchmark(job) -> Benchmark:
    """The prompts a cell job decodes: its benchmark, narrowed to the job's block when it is
    one (`job.prompts`). Every process that decodes a job builds its prompts here, the
    engine's own included, so a block's job never decodes the whole benchmark."""
    bench = build_benchmark(job.cell.benchmark, job.benchmark)
    return bench if job.prompts is None else PromptBlock(bench, *job.prompts)


class PromptBlock:
    """Prompts [first, end) of a benchmark, which the block is in every other respect: what a
    block's job decodes (`study.rounds`)."""

    def __init__(self, bench, first: int, end: int | None) -> None:
        self.bench, self.first, self.end = bench, first, end

    def items(self):
        everything = self.bench.items()
        if self.first >= len(everything):
            raise BenchmarkError(f"benchmark {self.bench.name!r}: no prompts from {self.first} on (it has "
                                 f"{len(everything)}): lower its n or rounds.max_prompts")
        return everything[self.first:self.end]

    def describe(self) -> dict[str, Any]:
        return {**self.bench.describe(), "block": [self.first, self.end]}

    def __getattr__(self, name: str):
        return getattr(self.bench, name)
