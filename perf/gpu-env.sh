# Sourced by perf/gpu.sh and perf/gpu-default.sh: the carried wheels (perf/fetch-wheels.sh)
# installed into $SITE, first on PYTHONPATH, unless $PYTHON already has the locked
# transformers and Snakemake; src/ on PYTHONPATH; offline, quiet.
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-perf/gpu-carry}
SITE=${SITE:-${TMPDIR:-/tmp}/tokenflip-gpu-site}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TQDM_DISABLE=1

install_carried_wheels() {
  local wheels pinned t0
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
}
