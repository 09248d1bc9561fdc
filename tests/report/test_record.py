"""A run's record of itself (`tokenflip.report.record`): the jobs' times read from a Snakemake
log as Snakemake writes it, worked by hand."""

from __future__ import annotations

from tokenflip.report.record import job_seconds, pipeline_seconds

LOG = """Building DAG of jobs...
[Mon Dec  7 02:52:40 2026]
localrule prepare_model:
    output: resources/models/m
    jobid: 5
    reason: Missing output files
[Mon Dec  7 02:53:17 2026]
Finished jobid: 5 (Rule: prepare_model)
1 of 3 steps (33%) done
[Mon Dec  7 02:53:17 2026]
rule generate:
    input: resources/models/m
    jobid: 3
[Mon Dec  7 02:53:18 2026]
checkpoint decide_round:
    jobid: 7
[Mon Dec  7 02:53:25 2026]
Finished jobid: 7 (Rule: decide_round)
[Mon Dec  7 02:54:00 2026]
Finished jobid: 3 (Rule: generate)
3 of 3 steps (100%) done
"""


def test_job_times_and_the_pipelines_time_from_snakemakes_own_log(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    # prepare 02:52:40 → 02:53:17 (37 s); generate 02:53:17 → 02:54:00 (43 s), overlapping the
    # checkpoint 02:53:18 → 02:53:25 (7 s); the pipeline from the first stamp to the last: 80 s
    assert job_seconds(log) == {"prepare_model": [37.0], "generate": [43.0], "decide_round": [7.0]}
    assert pipeline_seconds(log) == 80.0
    log.write_text("Building DAG of jobs...\n")
    assert job_seconds(log) == {} and pipeline_seconds(log) is None
