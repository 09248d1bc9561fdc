"""`tokenflip gate`: three outcomes, consistent with the verdicts. A comparison fails where its
divergence above its noise floor is shown to exceed the bound (or accuracy dropped
significantly), passes where it is shown to be at most the bound, and is inconclusive
otherwise, saying how many prompts would decide it; exit 0, 1 or 3, a JUnit file that a
JUnit parser loads (inconclusive: skipped), and what it cannot judge (a cell missing, an
unreadable run) its own code, 4."""

from __future__ import annotations

import contextlib
import io
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pandas as pd
import pytest
from junitparser import JUnitXml

from tokenflip.analysis.verdict import with_verdicts

N = 64


def _row(label, n_diverged, n=N, acc_a=0.5, acc_b=0.5, mcnemar_p=1.0, axis="concurrency", status="done",
         cell_a=None):
    from tokenflip.analysis.statistics import wilson

    lo, hi = wilson(n_diverged, n)
    return {"pair_id": f"m/b/{axis}/{label}/ctx", "label": f"{axis}: {label}", "axis": axis, "context": "ctx",
            "cell_a": cell_a or f"{label}-a", "cell_b": f"{label}-b", "status": status, "n_prompts": n,
            "n_diverged": n_diverged, "divergence_rate": n_diverged / n, "divergence_ci_low": lo,
            "divergence_ci_high": hi, "accuracy_a": acc_a, "accuracy_b": acc_b, "mcnemar_p": mcnemar_p}


def _floor(parted=0):
    """The repeat pair of cell "base": the same setting run again, `parted` prompts parting."""
    return _row("again", parted, axis="repeat", cell_a="base")


def _summary(tmp_path, rows):
    """The pairs summary of `rows`, each pair parting on its first n_diverged prompts."""
    outcomes = {r["pair_id"]: ({f"p{i}" for i in range(r["n_prompts"])},
                               {f"p{i}" for i in range(r["n_diverged"])}) for r in rows}
    _write(tmp_path, with_verdicts(rows, outcomes))


def _write(tmp_path, rows, gate=None):
    """A pairs summary as `summarize` writes it: its provenance and its digest."""
    import pyarrow as pa

    from tokenflip.core import storage

    (tmp_path / "summary").mkdir(exist_ok=True)
    storage.write_table(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False),
                        tmp_path / "summary" / "pairs.parquet", {"kind": "summary", "table": "pairs", "run": "r",
                                                                  "gate": gate})


def _gate(tmp_path, *args):
    """`tokenflip gate` through the command line's own entry point, in this process (the
    command line's start-up is tested elsewhere): its exit code and what it printed."""
    from tokenflip.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(["gate", str(tmp_path), *args])
        except SystemExit as exc:
            code = exc.code
    return SimpleNamespace(returncode=code, stderr=err.getvalue())


def _run(tmp_path, rows, *args):
    _summary(tmp_path, rows)
    return _gate(tmp_path, *args)


def _cases(path):
    return {case.classname: case for suite in JUnitXml.fromfile(str(path)) for case in suite}


def test_the_gate_fails_passes_and_stays_inconclusive_where_the_figures_say(tmp_path):
    rows = [
        _floor(0),                                          # the base setting repeats itself on every prompt
        _row("quiet", 0, cell_a="base"),                    # none parted: paired 90% interval ±4.1 pp, within 5%
        _row("noisy", 3, cell_a="base"),                    # 3 of 64 above a floor of 0: +0.4 to +11.2 pp
        _row("loud", 20, cell_a="base"),                    # 20 of 64: +22.6 to +41.4 pp, above 5%
        _row("worse", 0, acc_a=0.75, acc_b=0.25, mcnemar_p=0.001, cell_a="base"),  # accuracy fell
        _row("better", 0, acc_a=0.25, acc_b=0.75, mcnemar_p=0.001, cell_a="base"),  # rose: not a failure
        _row("lost", 0, status="missing"),
    ]
    proc = _run(tmp_path, rows, "--max-divergence", "0.05")
    assert proc.returncode == 1, proc.stderr
    # The floor is what the others are judged against: not gated itself unless named.
    assert ("6 comparison(s) at --max-divergence 5.0%: 2 passed, 2 failed, 1 inconclusive, 1 not judged (a cell "
            "missing)") in proc.stderr
    lines = {line.split(" [")[0]: line for line in proc.stderr.splitlines() if line.split(" ")[0].isupper()}
    assert lines["FAIL concurrency: loud"].startswith(
        "FAIL concurrency: loud [ctx]: 20 of 64 parted; +31.2% above its floor of 0.0%, 90% interval +22.6% to "
        "+41.4%: above --max-divergence 5.0% (Holm-adjusted p = ")
    assert "accuracy dropped from 75.0% to 25.0% (McNemar p = 0.001)" in lines["FAIL concurrency: worse"]
    assert "neither shown above nor at most --max-divergence 5.0%; about " in lines["INCONCLUSIVE concurrency: noisy"]
    assert lines["MISSING concurrency: lost"] == ("MISSING concurrency: lost [ctx]: missing: a cell of this comparison "
                                                  "did not finish (lost-a vs lost-b); nothing to judge; verdict: none")
    cases = _cases(tmp_path / "gate.junit.xml")
    assert [type(r).__name__ for r in cases["concurrency: loud"].result] == ["Failure"]
    assert [type(r).__name__ for r in cases["concurrency: noisy"].result] == ["Skipped"]
    assert [type(r).__name__ for r in cases["concurrency: lost"].result] == ["Error"]
    assert cases["concurrency: quiet"].is_passed and cases["concurrency: better"].is_passed
    suite = ET.parse(tmp_path / "gate.junit.xml").getroot().find("testsuite")  # plain XML: what CI systems read
    assert [suite.get(k) for k in ("tests", "failures", "skipped", "errors")] == ["6", "2", "1", "1"]


def test_inconclusive_exits_3_only_where_nothing_failed_and_a_passing_run_exits_0(tmp_path):
    proc = _run(tmp_path, [_floor(0), _row("quiet", 0, cell_a="base"), _row("noisy", 3, cell_a="base")],
                "--max-divergence", "0.05")
    assert proc.returncode == 3, proc.stderr
    assert "1 passed, 0 failed, 1 inconclusive" in proc.stderr
    proc = _gate(tmp_path, "--max-divergence", "0.2")
    assert proc.returncode == 0 and "2 passed, 0 failed, 0 inconclusive" in proc.stderr, proc.stderr


def test_a_comparison_with_a_cell_missing_is_not_judged_and_exits_4_unless_another_failed(tmp_path):
    """A comparison whose cell did not finish measured nothing: never a pass, and not "more
    prompts would decide it" either; the gate says it cannot judge (4), naming the cells. A
    comparison shown to fail still fails the run (1)."""
    base = [_floor(0), _row("quiet", 0, cell_a="base")]
    proc = _run(tmp_path, [*base, _row("lost", 0, status="missing")], "--max-divergence", "0.05")
    assert proc.returncode == 4, proc.stderr
    assert "1 passed, 0 failed, 0 inconclusive, 1 not judged" in proc.stderr
    assert "(lost-a vs lost-b)" in proc.stderr
    assert "1 comparison(s) gated have a cell that did not finish" in proc.stderr
    proc = _run(tmp_path, [*base, _row("noisy", 3, cell_a="base"), _row("lost", 0, status="missing")],
                "--max-divergence", "0.05")
    assert proc.returncode == 4, proc.stderr  # missing outranks inconclusive: more prompts would not help it
    proc = _run(tmp_path, [*base, _row("loud", 20, cell_a="base"), _row("lost", 0, status="missing")],
                "--max-divergence", "0.05")
    assert proc.returncode == 1, proc.stderr
    # Only the comparisons asked for: the others gated alone pass.
    proc = _gate(tmp_path, "--max-divergence", "0.05", "--comparison", "concurrency: quiet")
    assert proc.returncode == 0, proc.stderr


def test_a_bound_of_zero_fails_on_any_prompt_parted_above_the_floor_and_one_passes_everything(tmp_path):
    """Zero tolerance (the batch-invariance tests' own rule): a prompt that parted where the
    floor did not fails; partings the floor shares do not."""
    rows = [_floor(2), _row("shared", 2, cell_a="base"), _row("more", 3, cell_a="base"), _row("alone", 1)]
    proc = _run(tmp_path, rows, "--max-divergence", "0")
    assert proc.returncode == 1, proc.stderr
    fails = sorted(line.split(" [")[0] for line in proc.stderr.splitlines() if line.startswith("FAIL"))
    assert fails == ["FAIL concurrency: alone", "FAIL concurrency: more"]
    assert "1 of 64 prompts parted where its floor did not, above --max-divergence 0" in proc.stderr
    assert _gate(tmp_path, "--max-divergence", "1").returncode == 0
    # A noise floor is gated where it is named, on its own rate, and said to be one.
    proc = _gate(tmp_path, "--max-divergence", "0", "--comparison", "repeat")
    assert proc.returncode == 1 and "2 of 64 prompts parted when the same setting ran again (a noise floor)" \
        in proc.stderr


def test_holm_keeps_many_borderline_comparisons_from_failing_by_chance(tmp_path):
    """One comparison just shown above the bound fails alone; among twenty it is adjusted."""
    from tokenflip.analysis.paired import p_excess_above

    k = next(k for k in range(64) if p_excess_above(k, 0, N, 0.05) < 0.05)  # the fewest that fail alone
    assert _run(tmp_path, [_floor(0), _row("edge", k, cell_a="base")], "--max-divergence", "0.05").returncode == 1
    rows = [_floor(0), _row("edge", k, cell_a="base")] + [_row(f"q{i}", 0, cell_a="base") for i in range(20)]
    proc = _run(tmp_path, rows, "--max-divergence", "0.05")
    assert proc.returncode == 3 and "INCONCLUSIVE concurrency: edge" in proc.stderr, proc.stderr


def test_a_comparison_without_a_floor_is_gated_on_its_own_rate(tmp_path):
    proc = _run(tmp_path, [_row("loud", 20), _row("quiet", 0, n=200)], "--max-divergence", "0.05")
    assert proc.returncode == 1 and "FAIL concurrency: loud [ctx]: 20 of 64 parted; +31.2% (no floor)" in proc.stderr
    assert "INCONCLUSIVE concurrency: quiet" not in proc.stderr  # 0 of 200: at most 1.5%


@pytest.mark.parametrize("bound", ["-0.1", "1.5", "nan"])
def test_a_bound_that_is_not_a_share_is_refused(tmp_path, bound):
    proc = _run(tmp_path, [_row("quiet", 0)], "--max-divergence", bound)
    assert proc.returncode == 2 and "--max-divergence" in proc.stderr


def test_an_unreadable_run_has_its_own_message_and_code(tmp_path):
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "no summary of pairs" in proc.stderr
    _summary(tmp_path, [_floor(0)])  # nothing but a noise floor: nothing to gate, never a pass
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "no comparison to gate" in proc.stderr
    (tmp_path / "summary" / "pairs.parquet").write_bytes(b"PAR1 not parquet")
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "not a readable summary of pairs" in proc.stderr


def test_the_gate_a_study_declares_travels_with_its_summary(tmp_path):
    """`gate: {max_divergence, comparisons}` in the config: the summary carries it, and
    `tokenflip gate RUN` applies it where no bound is given; a bound given replaces it, and
    gates every comparison unless --comparison names some."""
    import pyarrow as pa

    from tokenflip.core import storage

    rows = [_floor(0), _row("loud", 20, cell_a="base"), _row("quiet", 0, axis="load", cell_a="base"),
            _row("big", 20, axis="order", cell_a="base")]
    outcomes = {r["pair_id"]: ({f"p{i}" for i in range(N)}, {f"p{i}" for i in range(r["n_diverged"])}) for r in rows}
    judged = with_verdicts(rows, outcomes)
    (tmp_path / "summary").mkdir()
    path = tmp_path / "summary" / "pairs.parquet"

    def write(gate):
        storage.write_table(pa.Table.from_pandas(pd.DataFrame(judged), preserve_index=False), path,
                            {"kind": "summary", "table": "pairs", "run": "r", "gate": gate})

    write(None)
    proc = _gate(tmp_path)
    assert proc.returncode == 1 and "no bound to gate on: give --max-divergence" in proc.stderr
    write({"max_divergence": 0.5, "comparisons": ["concurrency", "load"]})
    proc = _gate(tmp_path)  # 20 of 64 is shown below 50%; "order" is not gated
    assert proc.returncode == 0 and "2 comparison(s) at --max-divergence 50.0%: 2 passed" in proc.stderr, proc.stderr
    write({"max_divergence": 0.05})
    proc = _gate(tmp_path)
    assert proc.returncode == 1 and "3 comparison(s) at --max-divergence 5.0%: 1 passed, 2 failed" in proc.stderr
    proc = _gate(tmp_path, "--max-divergence", "0.5", "--comparison", "order")
    assert proc.returncode == 0 and "1 comparison(s)" in proc.stderr


def test_what_the_gate_cannot_judge_has_its_own_code_never_a_pass(tmp_path):
    import pyarrow.parquet as pq

    rows = [_floor(0), _row("quiet", 0, cell_a="base")]
    outcomes = {r["pair_id"]: ({f"p{i}" for i in range(N)}, set()) for r in rows}
    judged = with_verdicts(rows, outcomes)
    assert _run(tmp_path, rows, "--max-divergence", "0.05").returncode == 0
    # an edited row (a count changed after summarising): the digest refuses it
    path = tmp_path / "summary" / "pairs.parquet"
    table = pq.read_table(path)
    edited = table.set_column(table.schema.get_field_index("n_diverged"), "n_diverged",
                              pa_array([3] * table.num_rows))  # 0 before
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "table_sha256" in proc.stderr and str(path) in proc.stderr
    # counts that are no counts, and a declared bound that is not a share
    for bad in ({"n_prompts": float("nan")}, {"n_diverged": N + 1}, {"n_prompts": -1}):
        _write(tmp_path, [judged[0], {**judged[1], **bad}])
        proc = _gate(tmp_path, "--max-divergence", "0.05")
        assert proc.returncode == 4 and "comparison 'concurrency: quiet'" in proc.stderr, (bad, proc.stderr)
    _write(tmp_path, judged, gate={"max_divergence": float("nan")})
    proc = _gate(tmp_path)
    assert proc.returncode == 4 and "gate.max_divergence nan, not a share" in proc.stderr
    _write(tmp_path, [{k: v for k, v in judged[1].items() if k != "status"}])
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "row 0 has no pair id, label or status" in proc.stderr


def pa_array(values):
    import pyarrow as pa

    return pa.array(values, type=pa.int64())


def test_a_refused_summary_leaves_no_summary_behind_to_gate(finished_tiny_study, tmp_path):
    import subprocess
    import sys

    from conftest import copy_run

    run = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    assert (run / "results" / "inc" / "summary" / "pairs.parquet").is_file()
    cell = next((run / "results" / "inc" / "cells").rglob("*.parquet"))
    cell.write_bytes(cell.read_bytes()[:-200])  # a truncated cell: refused by the summary
    summarize = subprocess.run([sys.executable, "-m", "tokenflip", "summarize", "--config",
                                str(finished_tiny_study.config)], cwd=run, capture_output=True, text=True)
    assert summarize.returncode == 1 and "the run's summary before is removed" in summarize.stderr
    proc = _gate(run / "results" / "inc", "--max-divergence", "0.05")
    assert proc.returncode == 4 and "no summary of pairs" in proc.stderr
