"""A short calibration on this machine for `tokenflip plan --cost --device cpu`.

A CPU's time per step depends on what it has (avx512_bf16, avx512_fp16, amx) far more than
a roofline says: without native fp16 an fp16 pass over a whole sequence costs tens of fp32
steps. So the study's own models are timed here, one thread as the pipeline's CPU jobs
run, in process CPU time: per precision a few decode steps with the cache on and passes
of growing length without it (which fix the time of a pass and of each position), the real
prompts' lengths through the tokenizer, how long the first prompts' generations really
run, the model's preparation and load, and the start of a job's interpreter.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from tokenflip.core.layout import MODELS_DIR
from tokenflip.study.cost.model import CostInputError, CpuCalibration, intervention_work

LENGTH_PROMPTS = 4  # prompts generated in full to measure how long generations run


class CalibrationError(CostInputError):
    """The study cannot be calibrated here (a model that is not on this machine)."""


# What Snakemake gives a job of one thread (a CPU job of the pipeline).
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def _child_cpu_seconds(cmd: list[str]) -> float:
    """Process CPU time (user + system) of running `cmd` with one thread."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Sharing off: the job's own process loads its model, as the cost model prices every job.
    subprocess.run(cmd, check=True, env={**os.environ, **ONE_THREAD, "TOKENFLIP_SHARE_LOADS": "0"},
                   stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def job_start_seconds() -> float:
    """CPU time of a fresh interpreter importing what a pipeline job imports."""
    return _child_cpu_seconds([sys.executable, "-c", "import tokenflip.cli.main, tokenflip.run.cell, tokenflip.analysis.compare"])


def cell_job_seconds(config: dict[str, Any], cell, model_dir: Path, scratch: Path) -> float:
    """CPU time of a whole generation job but its decoding: the cell's own `tokenflip
    generate` on one prompt and one token in fp32 (the interpreter, imports, model and
    tokenizer load, the benchmark, provenance and the file written)."""
    from tokenflip.study.plan import cell_job

    job = cell_job(config, dataclasses.replace(cell, precision="fp32"))
    job = dataclasses.replace(job, benchmark={**job.benchmark, "n": 1}, max_new_tokens=1)
    return _child_cpu_seconds([sys.executable, "-m", "tokenflip", "generate", "--job", job.dumps(), "--model-dir",
                               str(model_dir), "--out", str(scratch / "calibration-cell.parquet")])


def _cpu_time(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def _fastest_decode_seconds(model, ids: list[int], pad: int, repeats: int, *, max_new_tokens: int,
                            use_cache: bool) -> float:
    """Fastest of `repeats` runs of the decode loop on `ids` (process CPU seconds): the
    fastest is the least disturbed by whatever else the machine ran meanwhile."""
    import torch

    from tokenflip.run.decode import decode

    x = torch.tensor([ids])
    return min(_cpu_time(lambda: decode(model, x, torch.ones_like(x), max_new_tokens=max_new_tokens,
                                        use_cache=use_cache, eos_token_ids=[-1], pad_token_id=pad))[1]
               for _ in range(repeats))


def _one_pass_seconds(model, ids: list[int], pad: int, repeats: int) -> float:
    """A single pass of the decode loop over `ids` without a cache."""
    return _fastest_decode_seconds(model, ids, pad, repeats, max_new_tokens=1, use_cache=False)


def position_seconds(model, prompt: list[int], pad: int, repeats: int = 2) -> float:
    """Seconds per position of a pass: one pass over the prompt and one over the prompt tiled
    to twice, four times, ... its length, until the longer pass takes at least twice the
    shorter one (or the model's context is reached). A difference of two short passes is lost
    in the timer's noise on a small model (a fit on them can come out at zero, pricing a
    cache-off cell like a cache-on one); a difference as large as the pass itself cannot."""
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
    p = min(len(prompt), limit // 2)
    short = _one_pass_seconds(model, prompt[:p], pad, repeats)
    n, long = p, short
    while long < 2 * short and 2 * n <= limit:
        n *= 2
        long = _one_pass_seconds(model, (prompt[:p] * (n // p + 1))[:n], pad, repeats)
    return max(long - short, 0.0) / (n - p) if n > p else 0.0


def fit_pass(model, prompt: list[int], pad: int, repeats: int = 2) -> tuple[float, float]:
    """(seconds per pass, seconds per position) from the decode loop itself: the position's
    share from passes of growing length (`position_seconds`), the pass's from 8 steps with the
    cache on (the prefill, then one position a step), the fastest of `repeats` runs."""
    b = position_seconds(model, prompt, pad, repeats)
    on = _fastest_decode_seconds(model, prompt, pad, repeats, max_new_tokens=8, use_cache=True)
    # 8 passes over p + 7 positions
    a = max((on - b * (len(prompt) + 7)) / 8, 0.0)
    return a, b


def _precisions(config: dict[str, Any], model: str, cells, probes) -> set[str]:
    needed: set[str] = set()
    for cell in cells:
        if cell.model == model:
            passes, head = intervention_work(config["interventions"][cell.intervention], cell.precision)
            needed.update(passes)
            needed.update(["fp32"] if head else [])
    for probe, m, _ in probes:
        if m == model:
            options = config["probes"][probe]
            needed.update(options.get("precisions", []))
            needed.update(p for pair in options.get("pairs", []) for p in pair)
    return needed or {"fp32"}


def _model_dir(name: str, spec: dict[str, Any], models_dir: Path, scratch: Path, cal: CpuCalibration) -> Path:
    """The prepared model, prepared here (and timed) when it is not yet."""
    from tokenflip.models.prepare import prepare

    prepared = models_dir / name
    if (prepared / "model.json").is_file():
        return prepared
    if spec.get("source") == "hf" and not Path(spec["id"]).is_dir():
        raise CalibrationError(f"model {name!r} ({spec['id']}) is not prepared under {models_dir}: the CPU "
                               f"calibration times the model itself; run `snakemake --until prepare_model` first")
    out = scratch / name
    _, cal.prepare_s[name] = _cpu_time(lambda: prepare(spec, out))
    return out


def calibrate(config: dict[str, Any], cells, probes, root: str | None = None,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> CpuCalibration:
    """Time the study's models on this machine (see the module's docstring)."""
    import torch

    from tokenflip.models.prepare import load_prepared
    from tokenflip.run.benchmarks import build_benchmark
    from tokenflip.run.decode import decode, stop_criterion
    from tokenflip.run.runtime import encode_prompt, special_ids

    torch.set_num_threads(1)
    cal = CpuCalibration(job_start_s=job_start_seconds())
    log(f"calibration: a job's start {cal.job_start_s:.1f} CPU-s")
    models_dir = Path(root or ".") / MODELS_DIR
    probe_models = {m for _, m, _ in probes}
    with tempfile.TemporaryDirectory(prefix="tokenflip-calibration.") as scratch:
        for name in sorted({c.model for c in cells} | probe_models):
            model_dir = _model_dir(name, config["models"][name], models_dir, Path(scratch), cal)
            (model, tokenizer, _), cal.load_s[name] = _cpu_time(lambda: load_prepared(model_dir, "fp32", "cpu"))
            eos, pad = special_ids(model, tokenizer)
            benchmarks = sorted({c.benchmark for c in cells if c.model == name} | {b for _, m, b in probes if m == name})
            prompts = {}
            for bench_name in benchmarks:
                bench = build_benchmark(bench_name, config["benchmarks"][bench_name])
                encoded = [encode_prompt(tokenizer, bench, item) for item in bench.items()]
                prompts[bench_name] = encoded
                lengths = [len(x) for x in encoded]
                cal.prompt_tokens[(name, bench_name)] = (sum(lengths) / len(lengths), max(lengths))
                limit = config["benchmarks"][bench_name].get("max_new_tokens", config["generation"]["max_new_tokens"])
                stop = stop_criterion(tokenizer, bench.stop)
                steps = [decode(model, torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long),
                                max_new_tokens=limit, use_cache=True, eos_token_ids=eos, pad_token_id=pad,
                                stop=stop).steps for x in encoded[:LENGTH_PROMPTS]]
                cal.length_share[(name, bench_name)] = (sum(steps) / len(steps) / limit, max(steps) / limit)
                log(f"calibration: {name}/{bench_name}: prompts of {cal.prompt_tokens[(name, bench_name)][0]:.0f} "
                    f"tokens on average, generations of {sum(steps) / len(steps):.1f} of {limit} steps")
            del model
            first = next((c for c in cells if c.model == name), None)
            if first is not None:
                cal.cell_job_s[name] = cell_job_seconds(config, first, model_dir, Path(scratch))
                log(f"calibration: {name}: a generation job without its decoding {cal.cell_job_s[name]:.1f} CPU-s")
            sample = prompts[benchmarks[0]][0]
            for precision in sorted(_precisions(config, name, cells, probes)):
                model = load_prepared(model_dir, precision, "cpu")[0]
                cal.passes[(name, precision)] = fit_pass(model, sample, pad)
                a, b = cal.passes[(name, precision)]
                log(f"calibration: {name} {precision}: {a * 1e3:.1f} ms a pass + {b * 1e3:.2f} ms a position")
                del model
    return cal
