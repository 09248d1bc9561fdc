#!/usr/bin/env bash
# `tokenflip plan --cost --device cpu` against a measured run: the plan's CPU-hours for a
# config, then the pipeline run on it in a fresh directory, its process CPU time (user +
# system of Snakemake and every job) measured by /usr/bin/time.
#
#   bash perf/cost/check.sh config/config.yaml          # the default: ~10 min of CPU
#   bash perf/cost/check.sh perf/cost/study-random.yaml  # ~1.5 min
#   bash perf/cost/check.sh perf/cost/study-smollm2.yaml # ~3 min
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
config=$(realpath "$1")
work=${WORK:-$(mktemp -d /tmp/tokenflip-cost.XXXXXX)}
bin=${BIN:-$repo/.venv/bin}
mkdir -p "$work"
cd "$work"
"$bin/python" -m tokenflip plan --config "$config" --cost --device cpu --json --root "$work" > plan.json
PATH="$bin:$PATH" /usr/bin/time -f "%U %S %e" -o time.txt "$bin/snakemake" --snakefile "$repo/Snakefile" \
  --directory "$work" --configfile "$config" --cores "${CORES:-2}" --resources gpu=1 > snakemake.log 2>&1
"$bin/python" - "$work" <<'PY'
import json, platform, subprocess, sys
from pathlib import Path
work = Path(sys.argv[1])
plan = json.loads((work / "plan.json").read_text())
user, system, wall = map(float, (work / "time.txt").read_text().split()[-3:])
cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
            if l.startswith("model name")), platform.processor())
print(f"{cpu}: predicted {plan['total_seconds']:.0f} CPU-s, measured {user + system:.0f} CPU-s "
      f"({user + system and plan['total_seconds'] / (user + system):.2f}x), wall {wall:.0f} s")
PY
