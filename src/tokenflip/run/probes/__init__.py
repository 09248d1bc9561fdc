"""Mechanism probes: teacher-forced replays that explain why two cells diverged.

Each probe is one module that defines a `PROBE` (see `base.Probe`) and one line in
`PROBES` below; the config schema, the CLI and the Snakemake probe rules come from it."""

from __future__ import annotations

from tokenflip.core.registry import Registry
from tokenflip.run.probes import kv_cache, precision
from tokenflip.run.probes.base import COMMON_OPTIONS, Probe

# The probes a config may name: one line per probe.
PROBES: Registry[Probe] = Registry("probe", [
    kv_cache.PROBE,
    precision.PROBE,
])

__all__ = ["PROBES", "Probe", "COMMON_OPTIONS"]
