#!/usr/bin/env bash
# Fills perf/gpu-carry/ (git-ignored) with what `perf/gpu.sh` needs on a GPU machine whose
# Python 3.12 image has torch but not the rest, and that reaches no package registry:
#
#   wheels/              for CPython 3.12 on x86-64 Linux, versions from requirements.lock:
#                        transformers, tokenizers and huggingface-hub as pinned, Snakemake
#                        and its dependencies, jsonschema, gguf (what reads the default
#                        model's GGUF: perf/gpu-default.sh). Left out: what such an image has
#                        and the check uses as it is (SKIP below: numpy, safetensors, ...),
#                        and pulp (16 MB; the check runs Snakemake with --scheduler greedy).
#   models/tiny-llama/   the pipeline check's random model and tokenizer, in bf16; building
#                        it needs the GGUF tokenizer package, which such an image lacks.
#
# Then checks the transfer limit: working tree + this folder < 64 MiB. Run it here, where
# pip reaches the registry and the project's environment is installed:
#
#   bash perf/fetch-wheels.sh            # about 35 MiB, a minute
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
CARRY=${CARRY:-perf/gpu-carry}
WANTED=(transformers tokenizers huggingface_hub snakemake jsonschema gguf)
# In the GPU image already, and used from there: large, or tied to its torch, or any version does.
SKIP=(numpy hf-xet pulp pygments rich markdown-it-py mdurl pyyaml psutil safetensors jinja2 markupsafe
      charset-normalizer requests urllib3 idna certifi filelock fsspec tqdm wrapt)
SDIST_ONLY=(connection_pool)   # no wheel on the registry: built here (pure Python)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

normalise() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
pinned() {  # the version requirements.lock gives a name
  local want line
  want=$(normalise "$1")
  while IFS= read -r line; do
    [[ $line == *==* && $line != \#* ]] || continue
    if [[ $(normalise "${line%%==*}") == "$want" ]]; then echo "${line#*==}"; return; fi
  done < requirements.lock
  echo "perf/fetch-wheels.sh: $1 is not in requirements.lock" >&2; exit 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
grep -v '^#' requirements.lock > "$stage/constraints.txt"

for name in "${SDIST_ONLY[@]}"; do
  "$PYTHON" -m pip wheel -q --no-deps --no-binary "$name" -w "$stage/built" "$name==$(pinned "$name")"
done
specs=()
for name in "${WANTED[@]}"; do specs+=("$name==$(pinned "$name")"); done
echo "# resolving ${specs[*]} (and their dependencies, as locked) for CPython 3.12 manylinux x86_64"
"$PYTHON" -m pip download -q -d "$stage/all" "${TARGET[@]}" --find-links "$stage/built" \
  -c "$stage/constraints.txt" "${specs[@]}"

rm -rf "$CARRY/wheels"
mkdir -p "$CARRY/wheels"
kept=0 skipped=()
for wheel in "$stage"/all/*.whl; do
  file=$(basename "$wheel")
  dist=$(normalise "${file%%-*}")
  skip=0
  for s in "${SKIP[@]}"; do [[ $dist == "$(normalise "$s")" ]] && skip=1; done
  if (( skip )); then skipped+=("$dist"); else cp "$wheel" "$CARRY/wheels/"; kept=$((kept + 1)); fi
done
echo "# $kept wheels in $CARRY/wheels ($(du -sh "$CARRY/wheels" | cut -f1)); left to the image: ${skipped[*]:-none}"

echo "# the pipeline check's model"
"$PYTHON" perf/gpu_check.py --prepare-model "$CARRY/models/tiny-llama" >/dev/null
echo "# $CARRY/models: $(du -sh "$CARRY/models" | cut -f1)"

echo "# transfer (MiB): working tree + $CARRY against the 64 MiB limit"
"$PYTHON" perf/gpu_check.py --budget --carry "$CARRY"
