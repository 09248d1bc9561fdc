#!/usr/bin/env bash
# The GPU check in one call (perf/gpu_check.py): the decode loop equals generate() bitwise
# on CUDA (Llama-2-7B, Mistral-7B and Gemma-2-2B widths, fp16/bf16, cache on/off, batch
# sizes 1 and 4), a small Snakemake run of the pipeline with its report, the performance
# scripts at 7B widths, and the cache and precision divergences of the 7B-width models.
# Writes $OUT/gpu-check.json and $OUT/gpu-check.log (and the pipeline's report); under
# 8 minutes on one H100/H200-class GPU, each part with its own deadline.
#
# On a machine without the project installed (a CUDA image with torch, offline), first
# run `bash perf/fetch-wheels.sh` where pip works: the wheels and the pipeline's model it
# puts in perf/gpu-carry/ are installed here into $SITE (not into the image) and put first
# on PYTHONPATH, so the pinned transformers is the one imported. src/ goes on PYTHONPATH.
#
#   bash perf/gpu.sh                                           # CUDA, python3
#   DEVICE=cpu PYTHON=.venv/bin/python bash perf/gpu.sh        # tiny shapes, same code, 1.5-2.5 min
#   PERF_LAYERS=32 bash perf/gpu.sh                            # all 32 layers in the perf part
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-perf/gpu-carry/out}
source perf/gpu-env.sh
mkdir -p "$OUT"

{
  echo "# tokenflip GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), device $DEVICE"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
  fi
  install_carried_wheels
  "$PYTHON" perf/gpu_check.py --device "$DEVICE" --out "$OUT" --carry "$CARRY" "$@"
} 2>&1 | tee "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
