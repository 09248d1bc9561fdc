#!/usr/bin/env bash
# The decode-loop, intervention and cache-off benchmarks on a CUDA GPU, on a randomly
# initialised Llama with the layer shapes of a 1B model (hidden 2048, 16 layers, 32 heads,
# 8 KV heads, intermediate 5632, vocab 32000): no download, no tokenizer, no GGUF wheel.
# Needs python with torch (CUDA) and transformers, and this repository (not installed:
# src/ goes on PYTHONPATH). Writes everything to gpu-benchmarks.txt (or $OUT).
#
#   bash perf/gpu.sh            # about 3-5 minutes on one H100/H200-class GPU
#   bash perf/gpu.sh --quick    # fewer rounds
#   MODEL=random-small DEVICE=cpu bash perf/gpu.sh --quick    # smoke test without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
MODEL=${MODEL:-random-1b}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-gpu-benchmarks.txt}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "# tokenflip GPU benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  fi
  "$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  echo
  status=0
  for script in decode_vs_generate interventions cache_off_scaling; do
    "$PYTHON" "perf/$script.py" --model "$MODEL" --device "$DEVICE" "$@" || { status=$?; echo "# $script failed ($status)"; }
    echo
  done
  echo "# summary lines"
  exit $status
} 2>&1 | tee "$OUT.tmp"
status=${PIPESTATUS[0]}
grep -h '^summary:' "$OUT.tmp" >> "$OUT.tmp" || true
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT"
exit "$status"
