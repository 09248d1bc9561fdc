# tokenflip: one job per cell, one per pair, then summaries and the HTML report.
# Usage: snakemake --cores all --resources gpu=1 [--configfile config/paper-kv-cache.yaml]
from tokenflip import config as tokenflip_config

configfile: "config/config.yaml"

for _path in workflow.configfiles:
    tokenflip_config.read_yaml(_path)  # refuses duplicate keys, which plain YAML drops silently
_validated = tokenflip_config.validate(config, source=", ".join(map(str, workflow.configfiles)) or "config")
config.clear()
config.update(_validated)


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        REPORT,
