# tokenflip: one job per cell, one per pair, then summaries and the HTML report.
# Usage: snakemake --cores all --resources gpu=1 [--configfile config/paper-kv-cache.yaml]
import os
import sys

from tokenflip import config as tokenflip_config

# Jobs call the `tokenflip` command of the installation that runs Snakemake (its bin
# directory goes first on PATH, which SLURM jobs inherit); with
# --software-deployment-method conda, the job's environment comes first instead.
envvars:
    "PATH",


_search_path = os.environ["PATH"]
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), _search_path])

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


onerror:
    # A job failed (with --keep-going, after every other job finished). `summarize` needs
    # all of its inputs, so it could not run: render reports/{run}/index.html here, from
    # the cells and pairs that exist, with the failed and skipped ones listed as missing.
    # The next run must not take this partial report for finished work (Snakemake does
    # not rebuild missing cells while the report they feed exists), so the report is left
    # marked incomplete: with `rerun-incomplete` (set in every profile under
    # workflow/profiles) the next run redoes it, and `summarize`, and whatever cells are
    # still missing; a plain `snakemake` stops and asks for --rerun-incomplete. The
    # summaries of an earlier run are removed: they no longer match the report. Nothing of
    # this happens when the run was not meant to make the report (say, a single cell).
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    try:
        _report_jobs = [job for job in workflow.dag.needrun_jobs() if job.rule.name == "report"]
    except Exception:  # another Snakemake version: do not guess
        _report_jobs = []
    if _report_jobs:
        _run_dir = Path(f"results/{RUN}")
        _log = Path(f"logs/{RUN}/report-partial.log")
        _log.parent.mkdir(parents=True, exist_ok=True)
        _run_dir.mkdir(parents=True, exist_ok=True)
        _tmp = Path(tempfile.mkdtemp(prefix=".summary-partial.", dir=_run_dir))
        try:
            with _log.open("w") as _fh:
                for _args in (["summarize", "--config-json", CONFIG_JSON, "--results", str(_run_dir),
                               "--out-dir", str(_tmp)],
                              ["report", "--config-json", CONFIG_JSON, "--summary-dir", str(_tmp),
                               "--out", REPORT]):
                    subprocess.run([sys.executable, "-m", "tokenflip", *_args], stdout=_fh,
                                   stderr=subprocess.STDOUT, check=True)
            for _summary in SUMMARIES:
                Path(_summary).unlink(missing_ok=True)
            try:
                workflow.persistence.started(_report_jobs[0])  # marks the report incomplete
                print(f"tokenflip: some jobs failed; partial report, with the missing cells and pairs "
                      f"listed: {REPORT}", file=sys.stderr)
            except Exception:  # cannot mark it: keep it under another name, out of the DAG
                _partial = Path(REPORT).with_name("index.partial.html")
                Path(REPORT).replace(_partial)
                print(f"tokenflip: some jobs failed; partial report, with the missing cells and pairs "
                      f"listed: {_partial}", file=sys.stderr)
        except (OSError, subprocess.CalledProcessError) as _exc:
            print(f"tokenflip: some jobs failed, and the partial report failed too ({_exc}); "
                  f"see {_log}", file=sys.stderr)
        finally:
            shutil.rmtree(_tmp, ignore_errors=True)
