"""A cell and a probe at run time (generate.smk, probe.smk): the cell runner, the decode
loop, caches, sampling, interventions, and the engines, benchmarks, sandbox and probes, each
from its registry."""
