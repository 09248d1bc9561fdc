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

`--budget` prints what a call of the device machine would carry (the working tree and the
carried wheels and model) against its 64 MiB limit.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

PERF = Path(__file__).resolve().parent
REPO = PERF.parent
DEFAULT_CARRY = PERF / "gpu-carry"
TRANSFER_LIMIT = 64 * 2**20  # what one call of the device machine may carry

PARTS = ("decode_equals_generate", "pipeline", "perf", "divergence")
# Seconds per part before it is stopped. On CUDA they sum, with the grace below, the wheel
# install and the start, to under 8 minutes. On a CPU with tiny shapes the parts need
# about 1.5 minutes together; the budgets leave room for a machine shared with others.
BUDGETS = {
    "cuda": {"decode_equals_generate": 75, "pipeline": 100, "perf": 140, "divergence": 75},
    "cpu": {"decode_equals_generate": 60, "pipeline": 180, "perf": 90, "divergence": 60},
}
GRACE = 8  # seconds past a part's deadline before its process group is stopped
# The whole run (after the wheels are installed), every part's grace and stop included: a
# part gets at most what is left of it, so one call of `gpu.sh` stays under 8 minutes.
TOTAL_BUDGETS = {"cuda": 440, "cpu": 600}

# Widths of the papers' architectures (layers set separately). The sliding windows are
# shortened to 64 so that prompts of 50-80 tokens plus the generated ones cross them.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),  # Llama-2-7B
    "mistral": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000, sliding_window=64,
                    max_position_embeddings=4096),  # Mistral-7B (window 4096)
    "gemma2": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=256, vocab_size=256000, sliding_window=64,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256,
                   max_position_embeddings=8192),  # Gemma-2-2B (window 4096)
}
REAL_LAYERS = 4
TINY_VOCAB = 4096

# The pipeline's model: the tiny random Llama of the tests with tied embeddings, saved in
# bf16 (half the bytes to carry); the GPU machine has no GGUF tokenizer package, so it
# reaches the pipeline as a local `hf` directory.
PIPELINE_MODEL_SPEC = {"source": "random", "architecture": "llama", "seed": 0,
                       "overrides": {"tie_word_embeddings": True}}
PIPELINE_MODEL_DIR = "models/tiny-llama"


def log(msg: str) -> None:
    print(msg, flush=True)


def _finite(x: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those become strings."""
    if x is None:
        return None
    x = float(x)
    return x if x == x and abs(x) != float("inf") else str(x)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False, default=str))
    os.replace(tmp, path)


# --- the transfer budget ---------------------------------------------------------------


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what a call carries without `carry`: tracked files and untracked files
    that git does not ignore (the working tree's copies, as they are now)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        path = repo / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def transfer_budget(carry: Path, repo: Path = REPO, limit: int = TRANSFER_LIMIT) -> dict[str, Any]:
    """The working tree plus the carried folder against the device machine's limit."""
    tree = tree_bytes(repo)
    carried = dir_bytes(carry) if Path(carry).exists() else 0
    wheels = dir_bytes(Path(carry) / "wheels") if (Path(carry) / "wheels").exists() else 0
    return {"tree_bytes": tree, "carry_bytes": carried, "wheel_bytes": wheels, "total_bytes": tree + carried,
            "limit_bytes": limit, "fits": tree + carried < limit}


# --- a part's record, rewritten after every sub-check -----------------------------------


class Recorder:
    """What one part found so far, written to `path` after every change, with the part's deadline."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path = path
        self.deadline = deadline
        self.data: dict[str, Any] = {"status": "running", "checks": [], "skipped": []}
        self.save()

    def left(self) -> float:
        return self.deadline - time.time()

    def room(self, seconds: float, until: float | None = None) -> bool:
        """Whether `seconds` still fit before the part's deadline (or the earlier `until`)."""
        end = self.deadline if until is None else min(until, self.deadline)
        return end - time.time() > seconds

    def share(self, index: int, count: int) -> float:
        """The end of item `index`'s equal share of the time left, among `count` items."""
        return time.time() + self.left() / (count - index)

    def save(self) -> None:
        write_json(self.path, self.data)

    def add(self, check: dict[str, Any]) -> None:
        self.data["checks"].append(check)
        self.save()

    def skip(self, name: str, why: str) -> None:
        log(f"  skipped {name}: {why}")
        self.data["skipped"].append({"name": name, "why": why})
        self.save()

    def guarded(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one sub-check; an exception becomes an `error` entry instead of ending the part."""
        t0 = time.perf_counter()
        try:
            check = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, and the next sub-check runs
            check = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()[-3000:]}
            log(traceback.format_exc())
        check = {"name": name, **check, "seconds": round(time.perf_counter() - t0, 2)}
        log(f"  {name}: {check['status'].upper()} ({check['seconds']:.1f} s)"
            + (f" {check.get('error', '')}" if check["status"] == "error" else ""))
        self.add(check)
        return check

    def finish(self, **extra: Any) -> None:
        self.data.update(extra)
        statuses = [c["status"] for c in self.data["checks"]]
        if "status" not in extra or self.data["status"] == "running":
            if not statuses or all(s == "skipped" for s in statuses):
                self.data["status"] = "skipped"
            elif all(s in ("pass", "skipped") for s in statuses):
                self.data["status"] = "pass"
            elif "error" in statuses:
                self.data["status"] = "error"
            elif "timeout" in statuses:
                self.data["status"] = "timeout"
            else:
                self.data["status"] = "fail"
        self.save()


# --- models ---------------------------------------------------------------------------


def arch_shape(arch: str, shapes: str, layers: int | None) -> dict[str, Any]:
    if shapes == "real":
        shape = dict(REAL_SHAPES[arch], num_hidden_layers=layers or REAL_LAYERS)
    else:
        from tokenflip.models import TINY_ARCHITECTURES

        shape = dict(TINY_ARCHITECTURES[arch], vocab_size=TINY_VOCAB)
        if layers:
            shape["num_hidden_layers"] = layers
    return shape


def build_random(arch: str, shapes: str, device: str, layers: int | None = None, seed: int = 0):
    """An fp32 random model of `arch` built on `device` (bos 1, eos 2, pad 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = arch_shape(arch, shapes, layers)
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2, pad_token_id=0, **kwargs)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


def in_precision(master, precision: str):
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return copy.deepcopy(master).to(dtype).eval()


def random_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    import _common as c

    return c.prompts(None, n, seed=seed, vocab_size=vocab)


def free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def model_facts(model) -> dict[str, Any]:
    cfg = model.config
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "sliding_window": getattr(cfg, "sliding_window", None),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


# --- part 1: the decode loop equals generate() ----------------------------------------


def compare_with_generate(model, ids, mask, new_tokens: int, use_cache: bool, eos: int = 2,
                          pad: int = 0) -> dict[str, Any]:
    """Our loop and generate() on the same inputs: tokens and every step's fp32 logits, bitwise."""
    import torch

    from tokenflip.decode import decode, greedy

    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits.clone())
        return greedy(logits, step)

    ours = decode(model, ids, mask, max_new_tokens=new_tokens, use_cache=use_cache, eos_token_ids=[eos],
                  pad_token_id=pad, select=select)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, eos_token_id=eos,
                             pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
    first_diff, max_diff = None, 0.0
    for step, (mine, theirs) in enumerate(zip(seen, ref.logits)):
        if not torch.equal(mine, theirs):
            first_diff = step if first_diff is None else first_diff
            max_diff = max(max_diff, float((mine - theirs).abs().max()))
    tokens_equal = True
    for row, gen in enumerate(ours.generations):
        expected = ref.sequences[row, ids.shape[1]:].tolist()
        n = len(gen.token_ids)
        tokens_equal &= gen.token_ids == expected[:n] and all(t == pad for t in expected[n:])
    steps_equal = ours.steps == len(ref.logits)
    record_equal = record_matches(ours.generations, seen)
    ok = steps_equal and first_diff is None and tokens_equal and record_equal
    return {"status": "pass" if ok else "fail", "steps": ours.steps, "generate_steps": len(ref.logits),
            "tokens_equal": tokens_equal, "logits_equal": first_diff is None and steps_equal,
            "record_equal": record_equal,
            "first_logit_diff_step": first_diff, "max_abs_logit_diff": _finite(max_diff),
            "prompt_tokens": int(ids.shape[1])}


def record_matches(generations, step_logits) -> bool:
    """Whether the loop's record (kept on the device, moved once) holds, bitwise, the
    statistics `step_statistics` computes alone from each step's logits."""
    import numpy as np

    from tokenflip.decode import step_statistics

    for step, logits in enumerate(step_logits):
        expected = {name: t.cpu().numpy() for name, t in step_statistics(logits, 16).items()}
        for row, gen in enumerate(generations):
            if step >= len(gen.token_ids):
                continue
            got = {"top_ids": gen.top_ids[step], "top_logits": gen.top_logits[step], "margin": gen.margin[step],
                   "logsumexp": gen.logsumexp[step], "entropy": gen.entropy[step]}
            if not all(np.asarray(got[name]).astype(values.dtype).tobytes() == values[row].tobytes()
                       for name, values in expected.items()):
                return False
    return True


def part_decode_equals_generate(rec: Recorder, args) -> None:
    from tokenflip.decode import left_pad

    new_tokens = 32 if args.shapes == "real" else 12
    rec.data.update(new_tokens=new_tokens, shapes=args.shapes)
    archs = list(REAL_SHAPES)
    for i, arch in enumerate(archs):
        until = rec.share(i, len(archs))  # the architectures still to come keep their share
        if not rec.room(3.0, until):
            rec.skip(arch, f"{rec.left():.0f} s left")
            continue
        try:
            master = build_random(arch, args.shapes, args.device, args.layers)
        except Exception as exc:  # noqa: BLE001
            rec.add({"name": arch, "status": "error", "error": f"building the model: {exc}",
                     "traceback": traceback.format_exc()[-3000:]})
            continue
        vocab = master.config.vocab_size
        rec.data.setdefault("models", {})[arch] = model_facts(master)
        prompts = random_prompts(4, vocab, seed=10 + i)
        batches = {1: left_pad(prompts[:1], 0), 4: left_pad(prompts, 0)}
        for precision in ("fp16", "bf16"):
            model = in_precision(master, precision)
            rec.data["models"][arch]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            for use_cache in (True, False):
                for bs, (ids, mask) in batches.items():
                    name = f"{arch}/{precision}/cache-{'on' if use_cache else 'off'}/bs{bs}"
                    if not rec.room(1.0, until):
                        rec.skip(name, f"{rec.left():.0f} s left, of which {until - time.time():.0f} s for {arch}")
                        continue
                    check = rec.guarded(name, lambda: compare_with_generate(model, ids, mask, new_tokens, use_cache))
                    check.update(arch=arch, precision=precision, cache=use_cache, batch_size=bs)
                    rec.save()
            del model
            free(args.device)
        del master
        free(args.device)
    rec.finish()


# --- part 2: a real pipeline run -------------------------------------------------------


def prepare_pipeline_model(out_dir: Path) -> Path:
    """The pipeline check's model as a plain Hugging Face directory (weights in bf16 and
    the tokenizer), built here from the random spec: it needs the GGUF tokenizer package,
    which the GPU machine lacks, so it travels with the wheels."""
    import torch

    from tokenflip.models import build_model

    out_dir = Path(out_dir)
    model, tokenizer = build_model(PIPELINE_MODEL_SPEC)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent if out_dir.parent.exists() else None))
    try:
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "spec.json").write_text(json.dumps(PIPELINE_MODEL_SPEC, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def pipeline_config(model_dir: Path, device: str) -> dict[str, Any]:
    """On CUDA, bf16 and fp16 with the cache on and off (four GPU jobs, one at a time),
    compared along the cache and the precision axis. On a CPU (every job a process that loads torch,
    on a small shared machine), bf16 with the cache on and off, compared."""
    generation: dict[str, Any] = {"record_top_k": 8, "device": device}
    if device == "cuda":
        grids = [{"precision": ["bf16", "fp16"], "cache": ["on", "off"], "batch_size": [1]}]
        benchmark = {"kind": "arithmetic", "n": 8, "max_new_tokens": 24}
        comparisons = [{"axis": "cache", "a": "on", "b": "off"}, {"axis": "precision", "a": "bf16", "b": "fp16"}]
    else:
        generation["threads"] = 1
        grids = [{"precision": ["bf16"], "cache": ["on", "off"], "batch_size": [1]}]
        benchmark = {"kind": "arithmetic", "n": 2, "max_new_tokens": 8}
        comparisons = [{"axis": "cache", "a": "on", "b": "off"}]
    return {
        "run": "gpucheck",
        "models": {"tiny-llama": {"source": "hf", "id": str(model_dir)}},
        "benchmarks": {"arith": benchmark},
        "generation": generation,
        "interventions": {"none": {"kind": "none"}},
        "grids": grids,
        "comparisons": comparisons,
    }


def expected_cells(config: dict[str, Any]) -> int:
    n = 0
    for grid in config["grids"]:
        n += len(grid["precision"]) * len(grid["cache"]) * len(grid["batch_size"])
    return n * len(config["models"]) * len(config["benchmarks"])


def run_group(cmd: list[str], timeout: float, **kwargs) -> tuple[int | None, float]:
    """Run `cmd` in its own process group; past `timeout`, end that group. (rc or None, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    try:
        rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 2)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        rc = None
    return rc, time.perf_counter() - t0


def part_pipeline(rec: Recorder, args) -> None:
    import yaml

    from tokenflip.storage import read_metadata

    model_dir = args.carry / PIPELINE_MODEL_DIR
    work = Path(tempfile.mkdtemp(prefix="tokenflip-gpu-pipeline."))
    try:
        if not (model_dir / "config.json").exists():
            log(f"  no carried model in {model_dir}: preparing it")
            model_dir = prepare_pipeline_model(work / "model")
        config = pipeline_config(model_dir, args.device)
        cfg_path = work / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        # The rules call `tokenflip`: the Snakefile puts the running interpreter's bin
        # directory first on PATH; where that has no `tokenflip` (a plain python with src/
        # on PYTHONPATH), this shim is found next.
        shim = work / "bin"
        shim.mkdir()
        (shim / "tokenflip").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tokenflip "$@"\n')
        (shim / "tokenflip").chmod(0o755)
        env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ.get('PATH', '')}")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
        cores = str(min(8, os.cpu_count() or 1)) if args.device == "cuda" else "2"
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
               "--configfile", str(cfg_path), "--cores", cores, "--resources", "gpu=1", "--scheduler", "greedy"]
        rec.data.update(command=" ".join(cmd[1:]), config=config)
        snake_log = work / "snakemake.log"
        with snake_log.open("w") as fh:
            rc, seconds = run_group(cmd, rec.left() - 3, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT)
        text = snake_log.read_text(errors="replace")
        log("  snakemake output (last lines):\n    " + "\n    ".join(text.splitlines()[-25:]))
        run_dir = work / "results" / config["run"]
        cells = {}
        for path in sorted((run_dir / "cells").rglob("*.parquet")):
            meta = read_metadata(path)
            env = meta.get("environment", {})
            cells[path.stem] = {"token_stream_sha256": meta.get("token_stream_sha256"),
                                "logits_sha256": meta.get("logits_sha256"),
                                "generated_tokens": meta.get("generated_tokens"),
                                "device": env.get("device", {}).get("name"),
                                "device_type": env.get("device", {}).get("type"),
                                "transformers": env.get("software", {}).get("transformers")}
        pairs = []
        summary = run_dir / "summary" / "pairs.parquet"
        if summary.exists():
            import pyarrow.parquet as pq

            for row in pq.read_table(summary).to_pylist():
                pairs.append({k: _finite(v) if isinstance(v, float) else v for k, v in row.items()
                              if k in ("pair_id", "axis", "context", "status", "divergence_rate",
                                       "exact_agreement", "n_prompts")})
        report = work / "reports" / config["run"] / "index.html"
        ok = rc == 0 and report.exists() and len(cells) == expected_cells(config) and all(
            c["token_stream_sha256"] and c["device_type"] == args.device for c in cells.values())
        check = {"name": "snakemake", "status": "pass" if ok else ("timeout" if rc is None else "fail"),
                 "returncode": rc, "seconds": round(seconds, 1), "cells": cells, "pairs": pairs,
                 "report_bytes": report.stat().st_size if report.exists() else None}
        if report.exists() and args.out and report.stat().st_size < 8 * 2**20:
            shutil.copy(report, args.out / "gpu-check-report.html")
            check["report_copy"] = "gpu-check-report.html"
        if not ok:  # the jobs' own logs say why
            for job_log in sorted((work / "logs").rglob("*.log")):
                tail = job_log.read_text(errors="replace").splitlines()[-15:]
                log(f"  --- {job_log.relative_to(work)}\n    " + "\n    ".join(tail))
            check["snakemake_tail"] = text[-3000:]
        log(f"  snakemake: {check['status'].upper()} ({seconds:.1f} s, {len(cells)} cells)")
        rec.add(check)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec.finish()


# --- part 3: the performance scripts --------------------------------------------------


def _float(m: re.Match | None, group: int = 1) -> float | None:
    return float(m.group(group)) if m else None


def parse_decode_vs_generate(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for block in re.split(r"\n(?=batch size \d+)", text)[1:]:
        bs = int(re.match(r"batch size (\d+)", block).group(1))
        tok_s = {m.group(1): float(m.group(2)) for m in
                 re.finditer(r"^\s+(generate|decode|decode-norecord)\s+wall .*?([\d.]+) tok/s wall", block, re.M)}
        out[f"bs{bs}"] = {
            "tokens_identical": "tokens identical across variants: True" in block,
            "tok_s_wall": tok_s,
            "decode_over_generate": _float(re.search(r"decode / generate throughput: ([\d.]+)x", block)),
            "recording_overhead_pct": _float(re.search(r"recording overhead .*?: ([+-][\d.]+)%", block)),
            "record_alone_pct_of_step": _float(re.search(r"record alone: .*?= ([\d.]+)% of a step", block)),
            "at_equal_forward_time": _float(re.search(r"at equal forward time: decode / generate ([\d.]+)x", block)),
            "host_ms_per_step_outside_forward": _per_variant(
                re.search(r"host time outside it: (.*?)   target", block), r" ([\d.]+) ms"),
            "decode_host_ms_without_statistics_arithmetic": _float(
                re.search(r"without the statistics' arithmetic .*?: decode ([\d.]+) ms", block)),
            "syncs_per_step_outside_forward": _per_variant(
                re.search(r"synchronisations per step, outside the forward pass \(inside it\): (.*)", block),
                r" ([\d.]+) \("),
            "cuda_syncs_per_step_outside_forward": _per_variant(
                re.search(r"by CUDA's sync debug mode: (.*)", block), r" ([\d.]+) \("),
        }
    return out


def _per_variant(line: re.Match | None, number: str) -> dict[str, float]:
    """{variant: figure} from a line listing "generate <figure>, decode <figure>, ...". """
    if not line:
        return {}
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"(generate|decode-norecord|decode)" + number, line.group(1))}


def parse_interventions(text: str) -> dict[str, Any]:
    m = re.search(r"summary: C-gated ([+-][\d.]+)% end to end \(([+-][\d.]+)% measured in the head; trigger rate "
                  r"([\d.]+)%\), C-ungated ([+-][\d.]+)%, global-fp32 ([+-][\d.]+)%", text)
    if not m:
        return {}
    return {"C_gated_pct": float(m.group(1)), "C_gated_in_head_pct": float(m.group(2)),
            "C_gated_trigger_rate_pct": float(m.group(3)), "C_ungated_pct": float(m.group(4)),
            "global_fp32_pct": float(m.group(5)), "paper_C_gated_pct": "< 4"}


def parse_cache_off(text: str) -> dict[str, Any]:
    rows = {}
    for m in re.finditer(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M):
        rows[m.group(1)] = {"on_ms_per_token": float(m.group(2)), "off_ms_per_token": float(m.group(3)),
                            "off_over_on": float(m.group(4))}
    fit = re.search(r"cache-off step time = ([-\d.]+) ms \+ ([-\d.]+) ms per token of context \(R\^2 ([-\d.]+)\)",
                    text)
    out: dict[str, Any] = {"per_new_tokens": rows}
    if fit:
        out.update(off_step_ms_intercept=float(fit.group(1)), off_step_ms_per_context_token=float(fit.group(2)),
                   off_fit_r2=float(fit.group(3)))
    return out


def perf_runs(args) -> list[tuple[str, list[str], float, Callable[[str], dict]]]:
    """(script, arguments, share of the part's time, parser) of each performance script."""
    if args.device == "cuda":
        model = ["--model", "random-7b", "--layers", str(args.perf_layers)]
        return [("decode_vs_generate", [*model, "--new-tokens", "48", "--rounds", "3", "--batch-sizes", "1", "8", "32"],
                 0.45,
                 parse_decode_vs_generate),
                ("interventions", [*model, "--new-tokens", "64", "--rounds", "5", "--prompts", "4"], 0.35,
                 parse_interventions),
                ("cache_off_scaling", [*model, "--lengths", "32", "64", "128"], 0.20, parse_cache_off)]
    model = ["--model", "random-small"]
    return [("decode_vs_generate", [*model, "--new-tokens", "4", "--rounds", "1", "--batch-sizes", "1", "8"], 0.45,
             parse_decode_vs_generate),
            ("interventions", [*model, "--new-tokens", "4", "--rounds", "1", "--prompts", "1"], 0.35,
             parse_interventions),
            ("cache_off_scaling", [*model, "--lengths", "4", "8"], 0.20, parse_cache_off)]


class _Tee(io.TextIOBase):
    """Writes to the log and keeps a copy to parse."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


class _OutOfTime(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> tuple[Any, bool]:
    """(fn's result, False), or (None, True) when it ran past `seconds` and was interrupted
    (a timer signal raises inside it; CUDA work is asynchronous, so this lands promptly)."""
    def on_alarm(signum, frame):
        raise _OutOfTime()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.1, seconds))
    try:
        return fn(), False
    except _OutOfTime:
        return None, True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def part_perf(rec: Recorder, args) -> None:
    """The performance scripts' own `main`, in this process, each with its share of the time."""
    import importlib

    runs = perf_runs(args)
    rec.data.update(model="random-7b" if args.device == "cuda" else "random-small",
                    layers=args.perf_layers if args.device == "cuda" else None)
    for i, (script, script_args, share, parse) in enumerate(runs):
        rest = sum(r[2] for r in runs[i:])
        timeout = rec.left() * share / rest
        if timeout < 5:
            rec.skip(script, f"{rec.left():.0f} s left")
            continue
        argv = [*script_args, "--device", args.device]
        log(f"  {script}: {' '.join(argv)} (at most {timeout:.0f} s)")
        module = importlib.import_module(script)
        buffer = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(_Tee(sys.stdout, buffer)):
                rc, timed_out = call_with_timeout(lambda: module.main(argv), timeout)
            error = None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded; the next script runs
            rc, timed_out, error = None, False, f"{type(exc).__name__}: {exc}"
            log(traceback.format_exc())
        seconds = time.perf_counter() - t0
        free(args.device)
        text = buffer.getvalue()
        try:
            figures = parse(text)
        except Exception as exc:  # noqa: BLE001 - the raw output is kept
            figures = {"parse_error": str(exc)}
        status = ("timeout" if timed_out else "error" if error else
                  "pass" if rc == 0 and figures else "fail")
        rec.add({"name": script, "status": status, "returncode": rc, "error": error, "seconds": round(seconds, 1),
                 "arguments": argv, "figures": figures,
                 "summary": [line for line in text.splitlines() if line.startswith(("summary:", "machine:"))],
                 "output_tail": text[-2500:] if status != "pass" else None})
        log(f"  {script}: {status.upper()} ({seconds:.1f} s)")
    rec.finish()


# --- part 4: divergence on the 7B-width models ----------------------------------------


def _run_prompt(model, prompt: list[int], new_tokens: int, use_cache: bool):
    """(tokens, per-step fp32 logits) of one greedy run that generates exactly `new_tokens`."""
    import torch

    from tokenflip.decode import decode, greedy

    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits[0].clone())
        return greedy(logits, step)

    ids = torch.tensor([prompt])
    res = decode(model, ids, torch.ones_like(ids), max_new_tokens=new_tokens, use_cache=use_cache,
                 eos_token_ids=[-1], pad_token_id=0, select=select, record_top_k=2)
    return res.generations[0].token_ids, seen


def compare_runs(a, b) -> dict[str, Any]:
    """First divergence of two runs of one prompt, |Δlogit| before it, and a's top-2 margin there."""
    tokens_a, logits_a = a
    tokens_b, logits_b = b
    first = next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), None)
    upto = len(tokens_a) if first is None else first + 1  # the step that diverged still saw the same prefix
    diffs = [float((logits_a[i].float().cpu() - logits_b[i].float().cpu()).abs().max()) for i in range(upto)]
    margin = None
    if first is not None:
        top = logits_a[first].float().topk(2).values
        margin = float(top[0] - top[1])
    return {"first_divergence": first, "step0_max_abs_logit_diff": diffs[0] if diffs else None,
            "max_abs_logit_diff_until_divergence": max(diffs) if diffs else None,
            "step0_bitwise_equal": bool(diffs) and diffs[0] == 0.0, "margin_at_divergence": margin}


def summarise_pairs(per_prompt: list[dict[str, Any]]) -> dict[str, Any]:
    diverged = [p for p in per_prompt if p["first_divergence"] is not None]
    return {"prompts": len(per_prompt), "diverged": len(diverged),
            "token_divergence_rate": len(diverged) / len(per_prompt) if per_prompt else None,
            "first_divergence_steps": [p["first_divergence"] for p in per_prompt],
            "max_abs_logit_diff_until_divergence": _finite(max(
                (p["max_abs_logit_diff_until_divergence"] or 0.0) for p in per_prompt)) if per_prompt else None,
            "step0_max_abs_logit_diff": _finite(max((p["step0_max_abs_logit_diff"] or 0.0) for p in per_prompt))
            if per_prompt else None,
            "step0_bitwise_equal_all": all(p["step0_bitwise_equal"] for p in per_prompt),
            "margins_at_divergence": [_finite(p["margin_at_divergence"]) for p in diverged]}


DIVERGENCE_PAIRS = {
    "cache_on_vs_off/bf16": (("bf16", True), ("bf16", False)),
    "cache_on_vs_off/fp16": (("fp16", True), ("fp16", False)),
    "bf16_vs_fp16/cache_on": (("bf16", True), ("fp16", True)),
    "bf16_vs_fp16/cache_off": (("bf16", False), ("fp16", False)),
}


def part_divergence(rec: Recorder, args) -> None:
    import torch

    real = args.shapes == "real"
    n_prompts, new_tokens = (8, 48) if real else (3, 12)
    rec.data.update(prompts=n_prompts, new_tokens=new_tokens, shapes=args.shapes)
    archs = list(REAL_SHAPES)
    cpu_vs_cuda_seconds = 25.0 if args.device == "cuda" else 0.0
    for i, arch in enumerate(archs):
        until = rec.share(i, len(archs)) - cpu_vs_cuda_seconds / len(archs)
        if not rec.room(3.0, until):
            rec.skip(arch, f"{rec.left():.0f} s left")
            continue

        def run_arch() -> dict[str, Any]:
            master = build_random(arch, args.shapes, args.device, args.layers)
            models = {p: in_precision(master, p) for p in ("bf16", "fp16")}
            facts = model_facts(master)
            del master
            free(args.device)
            prompts = random_prompts(n_prompts, facts["vocab"], seed=100 + i)
            per_pair: dict[str, list] = {name: [] for name in DIVERGENCE_PAIRS}
            done = 0
            for prompt in prompts:
                if done and not rec.room(1.0, until):
                    break
                runs = {(p, cache): _run_prompt(models[p], prompt, new_tokens, cache)
                        for p in ("bf16", "fp16") for cache in (True, False)}
                for name, (a, b) in DIVERGENCE_PAIRS.items():
                    per_pair[name].append(compare_runs(runs[a], runs[b]))
                done += 1
            del models
            free(args.device)
            return {"status": "pass" if done else "skipped", "arch": arch, "model": facts,
                    "prompts_run": done, "pairs": {name: summarise_pairs(v) for name, v in per_pair.items()}}

        rec.guarded(arch, run_arch)
    # The same bf16 weights on the CPU and on CUDA: where the kernels differ.
    if args.device != "cuda":
        rec.skip("cpu_vs_cuda", "the run is on the CPU")
    elif not rec.room(25.0):
        rec.skip("cpu_vs_cuda", f"{rec.left():.0f} s left")
    else:
        def cpu_vs_cuda() -> dict[str, Any]:
            master = build_random("llama", args.shapes, "cuda", args.layers)
            gpu = in_precision(master, "bf16")
            del master
            cpu = copy.deepcopy(gpu).to("cpu")
            torch.set_num_threads(os.cpu_count() or 1)
            per_prompt = []
            for prompt in random_prompts(2, gpu.config.vocab_size, seed=200):
                if per_prompt and not rec.room(10.0):
                    break
                per_prompt.append(compare_runs(_run_prompt(gpu, prompt, 12, True), _run_prompt(cpu, prompt, 12, True)))
            del gpu, cpu
            free("cuda")
            return {"status": "pass", "arch": "llama", "precision": "bf16", "cache": True, "new_tokens": 12,
                    **summarise_pairs(per_prompt)}

        rec.guarded("cpu_vs_cuda", cpu_vs_cuda)
    rec.finish()


PART_FUNCTIONS = {"decode_equals_generate": part_decode_equals_generate, "pipeline": part_pipeline,
                  "perf": part_perf, "divergence": part_divergence}


# --- the run ---------------------------------------------------------------------------


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def locked_versions(names: list[str]) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return {n: pins.get(re.sub(r"[-_.]+", "-", n).lower()) for n in names}


def code_digest(repo: Path = REPO) -> str:
    """sha256 over the code a run executes (src/, workflow/, Snakefile, perf/): it names the
    code where the copy that ran has no git history."""
    import hashlib

    h = hashlib.sha256()
    files = [repo / "Snakefile", *(repo / "src").rglob("*"), *(repo / "workflow").rglob("*"),
             *(repo / "perf").glob("*.py"), *(repo / "perf").glob("*.sh")]
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def environment(device: str) -> dict[str, Any]:
    """Versions of what ran: machine, GPU, driver, CUDA, torch, transformers and the pins."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "transformers": transformers.__version__, "transformers_path": str(Path(transformers.__file__).parent),
    }
    names = ["transformers", "tokenizers", "huggingface-hub", "safetensors", "snakemake", "numpy", "pyarrow",
             "pandas", "jsonschema"]
    env["packages"] = {n: _version(n) for n in names}
    locked = locked_versions(names)
    env["differs_from_lock"] = {n: {"here": env["packages"][n], "lock": locked[n]} for n in names
                                if locked[n] and env["packages"][n] != locked[n]}
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                           check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        env["git_commit"] = None
    env["code_sha256"] = code_digest()
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                      "multiprocessors": props.multi_processor_count,
                      "capability": f"{props.major}.{props.minor}"}
        env["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        env["matmul_reduced_precision_bf16"] = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        env["matmul_reduced_precision_fp16"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        env["sdpa_backends_enabled"] = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                                        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                                        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                                        "math": torch.backends.cuda.math_sdp_enabled()}
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            name, driver, memory = [s.strip() for s in smi.stdout.splitlines()[0].split(",")]
            env["gpu"].update(driver=driver, nvidia_smi_name=name, nvidia_smi_memory=memory)
        except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
            env["gpu"]["driver"] = None
    return env


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
