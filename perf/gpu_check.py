"""The GPU check: four independent parts in one short run, results in one JSON file.

1. decode_equals_generate: tokenflip's decode loop equals transformers `generate()`
   bitwise (tokens and the fp32 logits of every step): greedy, cache on and off, batch
   sizes 1 and 4 (left-padded), fp16 and bf16, on randomly initialised models with the
   widths of Llama-2-7B, Mistral-7B (sliding window, shortened to 64 so that it is
   exercised) and Gemma-2-2B (soft-capping, head_dim 256), with few layers.
2. pipeline: a small real Snakemake run (`--resources gpu=1`) of the project's own
   Snakefile on a tiny random model, report included; each cell's digests.
3. perf: decode_vs_generate.py, interventions.py and cache_off_scaling.py on a random
   model of Llama-2-7B widths (`--layers` of them), their figures parsed from the output.
4. divergence: cache on vs off and bf16 vs fp16 on the 7B-width models (token divergence
   rate, first divergence step, max |Δlogit| before it), and the same weights on the CPU
   against CUDA, since the kernels differ.

Each part runs in its own process with its own deadline: a sub-check that would not fit
is skipped and recorded as such, a part that overruns is killed (what it recorded so far
is kept), and a crash or failure in one part does not stop the others. The JSON is
rewritten after every part, so a run cut short still leaves every finished part.

    bash perf/gpu.sh                                    # CUDA, real widths, < 8 minutes
    DEVICE=cpu PYTHON=.venv/bin/python bash perf/gpu.sh # tiny shapes, same code, 1.5-2.5 minutes

This file runs the parts; each part lives in `perf/gpu_checks/`, one module per thing checked.

`--budget` prints what a call of the device machine would carry (the working tree and the
carried wheels and model) against its 64 MiB limit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parent
if str(PERF) not in sys.path:  # the parts' package beside this file (loaded by path in the tests)
    sys.path.append(str(PERF))

from gpu_checks.decode import part_decode_equals_generate, record_matches  # noqa: E402,F401 - the tests read it here
from gpu_checks.divergence import DIVERGENCE_PAIRS, part_divergence  # noqa: E402,F401 - the tests read the pairs here
from gpu_checks.environment import environment, locked_versions  # noqa: E402,F401
from gpu_checks.models import REAL_LAYERS  # noqa: E402
from gpu_checks.perf_scripts import part_perf  # noqa: E402
from gpu_checks.pipeline import part_pipeline, prepare_pipeline_model  # noqa: E402
from gpu_checks.record import REPO, Recorder, call_with_timeout, log, run_group, transfer_budget, tree_bytes, write_json  # noqa: E402,F401

DEFAULT_CARRY = PERF / "gpu-carry"

PARTS = ("decode_equals_generate", "pipeline", "perf", "divergence")
# The plan on CUDA, from the two H200 runs of 2026-12-04 (torch 2.11, CUDA 13.0): per part,
# what was measured there, what this version should take, and its budget (seconds).
H200_PLAN = {
    "decode_equals_generate": ("24 checks in 59 s with the part's start (budget 187 s); at 75 s, the 3 llama bf16 "
                               "checks were skipped (equal shares starved the costliest architecture)", 59, 59, 90),
    "pipeline": ("13 Snakemake steps, 4 GPU cells, 141 s (at 100 s, 3 of 4 cells); now 3 cells, one GPU job's "
                 "process, torch and CUDA start (about 20 s) fewer", 141, 120, 150),
    "perf": ("decode_vs_generate at batch 1 and 8 in its 61 s share, cut before 32 (3 rounds and 3 probe rounds "
             "of 48 tokens); interventions and cache_off_scaling within the rest (79 s); now 2 rounds and 2 probe "
             "rounds, 3 intervention rounds", 140, 130, 145),
    "divergence": ("3 architectures and the CPU vs CUDA check within its 75 s", 75, 70, 75),
}
# The install of the carried wheels and the check's own start (before the first part).
H200_START = ("wheels installed and the check started", 20)
# Seconds per part before it is stopped. On CUDA the plan's budgets; on a CPU with tiny
# shapes the parts need about 1.5 minutes together; the budgets leave room for a machine
# shared with others.
BUDGETS = {
    "cuda": {part: plan[3] for part, plan in H200_PLAN.items()},
    "cpu": {"decode_equals_generate": 60, "pipeline": 180, "perf": 90, "divergence": 60},
}
GRACE = 8  # seconds past a part's deadline before its process group is stopped
# The whole run (after the wheels are installed), every part's grace and stop included: a
# part gets at most what is left of it, so one call of `gpu.sh` stays under 8 minutes.
TOTAL_BUDGETS = {"cuda": 460, "cpu": 600}
LIMIT_S = 480  # what one call of the device machine may take


def budget_plan(device: str, scale: float = 1.0) -> list[str]:
    """The plan in words, printed before any part runs: each part's budget and what it rests
    on, and the sum against one call's 8 minutes."""
    budgets = {p: int(b * scale) for p, b in BUDGETS[device].items()}
    lines = [f"# budget plan ({device}{f', x{scale:g}' if scale != 1 else ''}):"]
    if device == "cuda":
        for part, (measured, _, expected, _) in H200_PLAN.items():
            lines.append(f"#   {part:24s} {budgets[part]:4d} s (expected {expected} s; H200: {measured})")
        start = H200_START[1]
        expected = start + sum(plan[2] for plan in H200_PLAN.values())
        lines.append(f"#   {H200_START[0]}: about {start} s; parts expected {expected - start} s, budgeted "
                     f"{sum(budgets.values())} s; the run is stopped at {TOTAL_BUDGETS['cuda'] * scale:.0f} s")
        lines.append(f"#   total at most {start + TOTAL_BUDGETS['cuda'] * scale:.0f} s of the call's {LIMIT_S} s; "
                     f"expected {expected} s (margin {LIMIT_S - expected} s)")
    else:
        lines += [f"#   {part:24s} {budgets[part]:4d} s" for part in budgets]
        lines.append(f"#   the run is stopped at {TOTAL_BUDGETS[device] * scale:.0f} s")
    return lines


PART_FUNCTIONS = {"decode_equals_generate": part_decode_equals_generate, "pipeline": part_pipeline,
                  "perf": part_perf, "divergence": part_divergence}


def run_parts(args) -> int:
    """Each part in its own process with its own deadline; the JSON after each part."""
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    budgets = {p: int(b * args.budget_scale) for p, b in BUDGETS[args.device].items()}
    result: dict[str, Any] = {"schema": 1, "environment": environment(args.device), "shapes": args.shapes,
                              "budgets_s": budgets, "grace_s": GRACE,
                              "total_budget_s": TOTAL_BUDGETS[args.device] * args.budget_scale,
                              "transfer": transfer_budget(args.carry) if (REPO / ".git").exists() else None,
                              "parts": {}}
    out_json = args.out / "gpu-check.json"
    env = result["environment"]
    log(f"# {env['date']} {env.get('gpu', {}).get('name', 'CPU')} driver {env.get('gpu', {}).get('driver')} "
        f"torch {env['torch']} (CUDA {env['torch_cuda']}) transformers {env['transformers']} "
        f"from {env['transformers_path']}; shapes {args.shapes}")
    if env["differs_from_lock"]:
        log(f"# versions that differ from requirements.lock: {env['differs_from_lock']}")
    result["plan"] = budget_plan(args.device, args.budget_scale)
    log("\n".join(result["plan"]))
    write_json(out_json, result)
    total_end = started + TOTAL_BUDGETS[args.device] * args.budget_scale
    for part in args.parts:
        budget = int(min(budgets[part], total_end - time.time() - GRACE - 5))
        if budget < 10:
            result["parts"][part] = {"status": "skipped", "checks": [], "skipped": [
                {"name": part, "why": f"{total_end - time.time():.0f} s left of the run's budget"}]}
            result["passed"] = False
            write_json(out_json, result)
            log(f"\n== part {part}: SKIPPED (the run's budget is spent)")
            continue
        log(f"\n== part {part} (at most {budget} s)")
        part_file = args.out / f".{part}.part.json"
        part_file.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--run-part", part, "--result", str(part_file),
               "--deadline", str(time.time() + budget), "--device", args.device, "--shapes", args.shapes,
               "--out", str(args.out), "--carry", str(args.carry), "--perf-layers", str(args.perf_layers)]
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        rc, seconds = run_group(cmd, budget + GRACE)
        try:
            data = json.loads(part_file.read_text())
        except (OSError, ValueError):
            data = {"checks": [], "skipped": []}
        if rc is None:
            data["status"] = "timeout"
        elif rc != 0 and data.get("status") in (None, "running", "pass"):
            data["status"] = f"crashed (exit {rc})"
        data["seconds"] = round(seconds, 1)
        part_file.unlink(missing_ok=True)
        result["parts"][part] = data
        result["seconds"] = round(time.time() - started, 1)
        result["passed"] = all(result["parts"].get(p, {}).get("status") == "pass" for p in args.parts)
        write_json(out_json, result)
        log(f"== part {part}: {data['status'].upper()} in {seconds:.0f} s")
    log("\n" + summary_table(result))
    log(f"wrote {out_json}")
    return 0 if result["passed"] else 1


def summary_table(result: dict[str, Any]) -> str:
    lines = [f"{'part':24s} {'status':10s} {'s':>6s}  checks (pass/all), skipped"]
    for part, data in result["parts"].items():
        checks = data.get("checks", [])
        passed = sum(c.get("status") == "pass" for c in checks)
        lines.append(f"{part:24s} {data['status']:10s} {data.get('seconds', 0):6.0f}  {passed}/{len(checks)}, "
                     f"{len(data.get('skipped', []))} skipped")
    use = result["parts"].get("decode_equals_generate", {}).get("record_graph_use")
    if use:
        lines.append("  the loop's record, batches by way: " + ", ".join(f"{way} {n}" for way, n in use.items()))
    perf = {c["name"]: c.get("figures", {}) for c in result["parts"].get("perf", {}).get("checks", [])}
    if perf.get("decode_vs_generate"):
        for bs, f in perf["decode_vs_generate"].items():
            lines.append(f"  {bs}: decode/generate {f.get('decode_over_generate')}x, recording "
                         f"{f.get('recording_overhead_pct')}%, tok/s {f.get('tok_s_wall')}, host ms per step "
                         f"outside the forward {f.get('host_ms_per_step_outside_forward')}, syncs per step "
                         f"{f.get('cuda_syncs_per_step_outside_forward') or f.get('syncs_per_step_outside_forward')}")
    if perf.get("interventions"):
        f = perf["interventions"]
        lines.append(f"  C-gated {f['C_gated_pct']:+.1f}% (paper < 4%), C-ungated {f['C_ungated_pct']:+.1f}%, "
                     f"global fp32 {f['global_fp32_pct']:+.1f}%")
    for c in result["parts"].get("divergence", {}).get("checks", []):
        for name, p in c.get("pairs", {}).items():
            lines.append(f"  {c['name']} {name}: {p['diverged']}/{p['prompts']} diverged, max |dlogit| before "
                         f"{p['max_abs_logit_diff_until_divergence']}")
    lines.append(f"all parts passed: {result.get('passed')}  ({result.get('seconds')} s)")
    return "\n".join(lines)


def run_one_part(args) -> int:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        rec = Recorder(args.result, args.deadline)
        rec.finish(status="error", error="torch sees no CUDA device")
        return 1
    if args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    rec = Recorder(args.result, args.deadline)
    try:
        PART_FUNCTIONS[args.run_part](rec, args)
    except Exception as exc:  # noqa: BLE001 - the part's record says what broke
        log(traceback.format_exc())
        rec.finish(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=os.environ.get("DEVICE", "cuda"))
    p.add_argument("--shapes", choices=["real", "tiny"], default=None,
                   help="model widths: the papers' (default on CUDA) or tiny (default on a CPU)")
    p.add_argument("--layers", type=int, default=None, help=f"layers of the part 1 and 4 models (default: "
                   f"{REAL_LAYERS} at real widths, 2 tiny)")
    p.add_argument("--perf-layers", type=int, default=int(os.environ.get("PERF_LAYERS", 16)),
                   help="layers of the 7B-width model of the performance scripts on CUDA (default 16 of 32)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every part's time budget")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", DEFAULT_CARRY / "out")))
    p.add_argument("--carry", type=Path, default=DEFAULT_CARRY,
                   help="the carried folder (wheels/, models/), as perf/fetch-wheels.sh fills it")
    p.add_argument("--budget", action="store_true", help="print the transfer size against the 64 MiB limit and exit "
                   "(non-zero when over)")
    p.add_argument("--prepare-model", type=Path, default=None, help="write the pipeline check's model there and exit")
    p.add_argument("--run-part", choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.shapes = args.shapes or ("real" if args.device == "cuda" else "tiny")
    args.carry = args.carry.resolve()
    args.out = args.out.resolve()
    if args.budget:
        b = transfer_budget(args.carry)
        mib = {k: round(v / 2**20, 2) for k, v in b.items() if k.endswith("_bytes")}
        print(json.dumps({**mib, "fits": b["fits"]}))
        return 0 if b["fits"] else 1
    sys.path.insert(0, str(PERF))
    import _common  # noqa: F401 - src/ on sys.path, quiet transformers, offline hub

    if args.prepare_model:
        print(prepare_pipeline_model(args.prepare_model))
        return 0
    if args.run_part:
        return run_one_part(args)
    return run_parts(args)


if __name__ == "__main__":
    raise SystemExit(main())
