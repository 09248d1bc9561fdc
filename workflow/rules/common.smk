# Target lists and per-job lookups. Every per-cell setting reaches a job through a lookup
# on its wildcards, so adding a model or a benchmark adds jobs without touching old ones.
import json
import os

from tokenflip.summary import SUMMARY_FILES
from tokenflip.plan import (COMPARABLE_AXES, Cell, cell_settings, expand_cells, expand_pairs, pair_from_wildcards,
                            PROBE_TABLES, probe_settings, probe_targets)

RUN = config["run"]
CELLS = expand_cells(config)
PAIRS = expand_pairs(config, CELLS)
CELL_FILES = [cell.path(RUN) for cell in CELLS]
PAIR_FILES = [pair.path(RUN) for pair in PAIRS]
PROBE_FILES = [f"results/{RUN}/probes/{model}/{bench}/{probe}/{table}.parquet"
               for probe, model, bench in probe_targets(config) for table in PROBE_TABLES[probe]]
SUMMARY_DIR = f"results/{RUN}/summary"
SUMMARIES = [f"{SUMMARY_DIR}/{name}" for name in SUMMARY_FILES]
REPORT = f"reports/{RUN}/index.html"
# The validated config; summaries and the report rerun when it changes.
CONFIG_JSON = json.dumps(config, sort_keys=True)


wildcard_constraints:
    model=r"[A-Za-z0-9_.][A-Za-z0-9_.-]*",
    benchmark=r"[A-Za-z0-9_.][A-Za-z0-9_.-]*",
    cell=r"(fp32|bf16|fp16)-(on|off)-bs\d+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+(-[a-z_]+=[A-Za-z0-9_.]+)*",
    axis="|".join(COMPARABLE_AXES),
    a=r"[A-Za-z0-9_.]+",
    b=r"[A-Za-z0-9_.]+",
    context=r"[A-Za-z0-9_.=-]+",
    probe=r"kv_cache|precision",


def cell_of(wildcards):
    return Cell.from_name(wildcards.model, wildcards.benchmark, wildcards.cell)


def cell_settings_json(wildcards):
    return json.dumps(cell_settings(config, cell_of(wildcards)), sort_keys=True)


def model_spec_json(wildcards):
    return json.dumps(config["models"][wildcards.model], sort_keys=True)


def pair_of(wildcards):
    return pair_from_wildcards(wildcards.model, wildcards.benchmark, wildcards.axis,
                               wildcards.a, wildcards.b, wildcards.context)


def pair_inputs(wildcards):
    pair = pair_of(wildcards)
    return {"a": pair.a.path(RUN), "b": pair.b.path(RUN)}


def pair_id(wildcards):
    return pair_of(wildcards).id


def probe_settings_json(probe):
    def lookup(wildcards):
        return json.dumps(probe_settings(config, probe, wildcards.model, wildcards.benchmark), sort_keys=True)
    return lookup


def probe_outputs(probe):
    return expand(f"results/{RUN}/probes/{{{{model}}}}/{{{{benchmark}}}}/{probe}/{{table}}.parquet",
                  table=PROBE_TABLES[probe])


def generate_threads(wildcards):
    """A cell on the threads axis gets exactly its threads; others the configured number
    or every core Snakemake was given (CPU generation is compute-bound)."""
    if "cell" in wildcards.keys():
        threads = cell_of(wildcards).threads
        if threads != "default":
            return int(threads)
    return config["generation"]["threads"] or workflow.cores
