# tokenflip: one job per cell, one per pair, probes, then summaries and the HTML report.
# Usage: snakemake --cores all --resources gpu=1 [--configfile my-study.yaml]
import os
import sys

from tokenflip.study import config as tokenflip_config
from tokenflip.core import scheduler as tokenflip_scheduler

# Jobs call the `tokenflip` command of the installation that runs Snakemake (its bin
# directory goes first on PATH, which SLURM jobs inherit); with
# --software-deployment-method conda, the job's environment comes first instead.
envvars:
    "PATH",


os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
# Every job inherits this scheduler's identity and stops if it dies (kill -9, a closed
# terminal), so that no job of a killed run writes a result later.
os.environ[tokenflip_scheduler.SCHEDULER_VARIABLE] = tokenflip_scheduler.scheduler_token()

# A study is exactly its config: a --configfile replaces config/config.yaml, never merges
# with it (so there is no `configfile:` directive); --config key=value still overrides.
_config_files = [str(path) for path in workflow.configfiles]
if _config_files:
    for _path in _config_files:
        tokenflip_config.read_yaml(_path)  # refuses duplicate keys, which plain YAML drops silently
    _raw_config = dict(config)
else:
    _config_files = [tokenflip_config.DEFAULT_CONFIG]
    _raw_config = tokenflip_config.merge(tokenflip_config.read_yaml(tokenflip_config.DEFAULT_CONFIG), config)
_validated = tokenflip_config.validate(_raw_config, source=", ".join(_config_files))
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


onerror:
    # A job failed (with --keep-going, after every other job finished): render what did
    # finish, listing what is missing, as reports/<run>/partial.html (`tokenflip report
    # --partial`); index.html is only ever a complete report.
    import subprocess

    os.makedirs(os.path.dirname(PARTIAL_LOG), exist_ok=True)
    with open(PARTIAL_LOG, "w") as _log:
        _done = subprocess.run([sys.executable, "-m", "tokenflip", "report", "--partial", "--config-json",
                                CONFIG_JSON], stdout=_log, stderr=subprocess.STDOUT)
    print(f"tokenflip: some jobs failed; partial report, with what is missing listed: {LAYOUT.partial_report}"
          if _done.returncode == 0 else f"tokenflip: the partial report failed too; see {PARTIAL_LOG}",
          file=sys.stderr)
