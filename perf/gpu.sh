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
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-perf/gpu-carry/out}
CARRY=${CARRY:-perf/gpu-carry}
SITE=${SITE:-${TMPDIR:-/tmp}/tokenflip-gpu-site}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TQDM_DISABLE=1

{
  echo "# tokenflip GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), device $DEVICE"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
  fi
  wheels=("$CARRY"/wheels/*.whl)
  pinned=$(grep -E '^(transformers|snakemake)==' requirements.lock | tr '\n' ' ')
  if "$PYTHON" -c 'import sys, importlib.metadata as m
sys.exit(any(m.version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))' $pinned 2>/dev/null; then
    echo "# $PYTHON has $pinned: nothing to install"
  elif [[ -e ${wheels[0]} ]]; then
    echo "# installing ${#wheels[@]} carried wheels into $SITE"
    t0=$SECONDS
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"; then
      export PYTHONPATH="$SITE:$PYTHONPATH" PATH="$SITE/bin:$PATH"
      echo "# installed in $((SECONDS - t0)) s"
    else
      echo "# installing the carried wheels failed: running with $PYTHON's own packages"
    fi
  else
    echo "# no wheels in $CARRY/wheels: running with $PYTHON's own packages"
  fi
  "$PYTHON" perf/gpu_check.py --device "$DEVICE" --out "$OUT" --carry "$CARRY" "$@"
} 2>&1 | tee "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
