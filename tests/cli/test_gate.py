"""`tokenflip gate`: three outcomes, read from the verdicts' own intervals (`analysis.decision`).
A comparison fails where the interval of its excess over its noise floor lies above the bound
(or accuracy is shown to drop), passes where it lies at or below it, and is inconclusive
otherwise, saying how many prompts would decide it; usage errors exit 2; exit 0, 1 or 3, a JUnit file that a
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

from tokenflip.analysis.decision import interval, with_decisions

N = 200


def _row(label, n_diverged, n=N, acc_a=0.5, acc_b=0.5, mcnemar_p=1.0, axis="concurrency", status="done",
         cell_a=None):
    from tokenflip.analysis.statistics import wilson

    lo, hi = wilson(n_diverged, n)
    return {"pair_id": f"m/b/{axis}/{label}/ctx", "label": f"{axis}: {label}", "axis": axis, "context": "ctx",
            "cell_a": cell_a or f"{label}-a", "cell_b": f"{label}-b", "status": status, "n_prompts": n,
            "n_diverged": n_diverged, "divergence_rate": n_diverged / n, "divergence_ci_low": lo,
            "divergence_ci_high": hi, "accuracy_a": acc_a, "accuracy_b": acc_b, "mcnemar_p": mcnemar_p}


def _floor(parted=0, n=N):
    """The repeat pair of cell "base": the same setting run again, `parted` prompts parting."""
    return _row("again", parted, n=n, axis="repeat", cell_a="base")


def with_verdicts(rows, outcomes):
    """The summary's rows as `summarize` makes them: one look at all prompts; each side's
    accuracy on its first accuracy × n prompts."""
    correct = {r["pair_id"]: [(f"p{i}", i < r["accuracy_a"] * r["n_prompts"], i < r["accuracy_b"] * r["n_prompts"])
                              for i in range(r["n_prompts"])] for r in rows}
    return with_decisions(rows, outcomes, lambda r: [r["n_prompts"]], correct=correct)


def _summary(tmp_path, rows):
    """The pairs summary of `rows`, each pair parting on its first n_diverged prompts."""
    outcomes = {r["pair_id"]: ([f"p{i}" for i in range(r["n_prompts"])],
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


def test_the_gate_fails_passes_and_stays_inconclusive_where_the_intervals_say(tmp_path):
    rows = [
        _floor(0),                                          # the base setting repeats itself on every prompt
        _row("quiet", 0, cell_a="base"),                    # none parted: the interval within ±4 pp
        _row("noisy", 10, cell_a="base"),                   # 10 of 200 above a floor of 0: straddles 5%
        _row("loud", 40, cell_a="base"),                    # 40 of 200: wholly above 5%
        _row("worse", 0, acc_a=0.75, acc_b=0.25, cell_a="base"),  # accuracy fell on 100 prompts
        _row("better", 0, acc_a=0.25, acc_b=0.75, cell_a="base"),  # rose: not a failure
        _row("lost", 0, status="missing"),
    ]
    proc = _run(tmp_path, rows, "--max-divergence", "0.05")
    assert proc.returncode == 1, proc.stderr
    # The floor is what the others are judged against: not gated itself unless named.
    assert ("6 comparison(s) at --max-divergence 5.0%: 2 passed, 2 failed, 1 inconclusive, 1 not judged (a cell "
            "missing)") in proc.stderr
    lines = {line.split(" [")[0]: line for line in proc.stderr.splitlines() if line.split(" ")[0].isupper()}
    low, high = interval(40, 160, 0, intervals=7)
    assert lines["FAIL concurrency: loud"].startswith(
        f"FAIL concurrency: loud [ctx]: 40 of 200 parted; above its noise floor {low:+.1%} to {high:+.1%}: above "
        f"--max-divergence 5.0%; verdict: changes outputs")
    assert "accuracy dropped from 75.0% to 25.0% (e-BH over the comparisons scored)" in lines["FAIL concurrency: worse"]
    assert "neither shown above nor at most --max-divergence 5.0%; " in lines["INCONCLUSIVE concurrency: noisy"]
    assert lines["MISSING concurrency: lost"] == ("MISSING concurrency: lost [ctx]: missing: a cell of this comparison "
                                                  "did not finish (lost-a vs lost-b); nothing to judge; verdict: none")
    cases = _cases(tmp_path / "gate.junit.xml")
    assert [type(r).__name__ for r in cases["concurrency: loud"].result] == ["Failure"]
    assert [type(r).__name__ for r in cases["concurrency: noisy"].result] == ["Skipped"]
    assert [type(r).__name__ for r in cases["concurrency: lost"].result] == ["Error"]
    assert cases["concurrency: quiet"].is_passed and cases["concurrency: better"].is_passed
    suite = ET.parse(tmp_path / "gate.junit.xml").getroot().find("testsuite")  # plain XML: what CI systems read
    assert [suite.get(k) for k in ("tests", "failures", "skipped", "errors")] == ["6", "2", "1", "1"]


def test_the_gate_never_contradicts_the_verdict(tmp_path):
    """Over every other count of 40 prompts against a floor of 0, at bounds 0 to 50%: a gate
    fail is always a "changes outputs" verdict, and a "within noise" one (±30 pp) always passes
    at a bound of at least its margin."""
    from tokenflip.cli.gate import judge_row

    rows = [_floor(0, n=40)] + [_row(f"k{k}", k, n=40, cell_a="base") for k in range(0, 41, 2)]
    out = with_decisions(rows, {r["pair_id"]: ([f"p{i}" for i in range(40)],
                                               {f"p{i}" for i in range(r["n_diverged"])}) for r in rows},
                         lambda r: [40], margin=0.3)
    seen = set()
    for r in out[1:]:
        for bound in (0.0, 0.1, 0.3, 0.5):
            result = judge_row(r, bound, int(r["intervals"])).result
            seen.add((r["verdict"], result))
            if result == "fail":
                assert r["verdict"] == "changes outputs", (r["n_diverged"], bound)
            if r["verdict"] == "within noise" and bound >= 0.3:
                assert result == "pass"
    assert {("within noise", "pass"), ("changes outputs", "fail")} <= seen  # neither check is vacuous


def test_inconclusive_exits_3_only_where_nothing_failed_and_a_passing_run_exits_0(tmp_path):
    proc = _run(tmp_path, [_floor(0), _row("quiet", 0, cell_a="base"), _row("noisy", 10, cell_a="base")],
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
    proc = _run(tmp_path, [*base, _row("noisy", 10, cell_a="base"), _row("lost", 0, status="missing")],
                "--max-divergence", "0.05")
    assert proc.returncode == 4, proc.stderr  # missing outranks inconclusive: more prompts would not help it
    proc = _run(tmp_path, [*base, _row("loud", 40, cell_a="base"), _row("lost", 0, status="missing")],
                "--max-divergence", "0.05")
    assert proc.returncode == 1, proc.stderr
    # Only the comparisons asked for: the others gated alone pass.
    proc = _gate(tmp_path, "--max-divergence", "0.05", "--comparison", "concurrency: quiet")
    assert proc.returncode == 0, proc.stderr


def test_a_bound_of_zero_fails_only_what_is_shown_above_the_floor(tmp_path):
    """A bound of 0 is a bound like any other: fail where the interval lies above 0 (the
    verdict "changes outputs"), never pass short of the whole benchmark, and a noise floor gated
    by name is judged on its own rate."""
    rows = [_floor(2), _row("shared", 2, cell_a="base"), _row("more", 60, cell_a="base"), _row("alone", 1)]
    proc = _run(tmp_path, rows, "--max-divergence", "0")
    assert proc.returncode == 1, proc.stderr
    fails = sorted(line.split(" [")[0] for line in proc.stderr.splitlines() if line.startswith("FAIL"))
    assert fails == ["FAIL concurrency: more"]
    assert "INCONCLUSIVE concurrency: shared" in proc.stderr and "INCONCLUSIVE concurrency: alone" in proc.stderr
    assert _gate(tmp_path, "--max-divergence", "1").returncode == 0
    proc = _gate(tmp_path, "--max-divergence", "0.5", "--comparison", "repeat")
    assert proc.returncode == 0 and "1 passed" in proc.stderr


def test_many_comparisons_widen_every_interval_the_gate_reads(tmp_path):
    """One comparison just above the bound alone fails; among twenty more its interval is at
    α/(2·22) a side and reaches below the bound: inconclusive, never a chance failure."""
    k = next(k for k in range(N) if interval(k, N - k, 0, intervals=2)[0] > 0.05)  # the fewest that fail alone
    assert _run(tmp_path, [_floor(0), _row("edge", k, cell_a="base")], "--max-divergence", "0.05").returncode == 1
    rows = [_floor(0), _row("edge", k, cell_a="base")] + [_row(f"q{i}", 0, cell_a="base") for i in range(20)]
    proc = _run(tmp_path, rows, "--max-divergence", "0.05")
    assert proc.returncode == 3 and "INCONCLUSIVE concurrency: edge" in proc.stderr, proc.stderr


def test_a_comparison_without_a_floor_is_gated_on_its_own_rate(tmp_path):
    proc = _run(tmp_path, [_row("loud", 40), _row("quiet", 0, n=400)], "--max-divergence", "0.05")
    assert proc.returncode == 1 and "FAIL concurrency: loud [ctx]: 40 of 200 parted; (its own rate: no floor)" \
        in proc.stderr
    assert "INCONCLUSIVE concurrency: quiet" not in proc.stderr  # 0 of 400: at most about 2%


def test_usage_errors_exit_2(tmp_path):
    _summary(tmp_path, [_floor(0), _row("quiet", 0, cell_a="base")])
    proc = _gate(tmp_path, "--max-divergence", "0.05", "--comparison", "no-such-axis")
    assert proc.returncode == 2 and "no comparison matches ['no-such-axis']" in proc.stderr
    proc = _gate(tmp_path)
    assert proc.returncode == 2 and "no bound to gate on" in proc.stderr


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

    rows = [_floor(0), _row("loud", 40, cell_a="base"), _row("quiet", 0, axis="load", cell_a="base"),
            _row("big", 40, axis="order", cell_a="base")]
    outcomes = {r["pair_id"]: ([f"p{i}" for i in range(N)], {f"p{i}" for i in range(r["n_diverged"])}) for r in rows}
    judged = with_verdicts(rows, outcomes)
    (tmp_path / "summary").mkdir()
    path = tmp_path / "summary" / "pairs.parquet"

    def write(gate):
        storage.write_table(pa.Table.from_pandas(pd.DataFrame(judged), preserve_index=False), path,
                            {"kind": "summary", "table": "pairs", "run": "r", "gate": gate})

    write(None)
    proc = _gate(tmp_path)
    assert proc.returncode == 2 and "no bound to gate on: give --max-divergence" in proc.stderr
    write({"max_divergence": 0.5, "comparisons": ["concurrency", "load"]})
    proc = _gate(tmp_path)  # 40 of 200 is shown below 50%; "order" is not gated
    assert proc.returncode == 0 and "2 comparison(s) at --max-divergence 50.0%: 2 passed" in proc.stderr, proc.stderr
    write({"max_divergence": 0.05})
    proc = _gate(tmp_path)
    assert proc.returncode == 1 and "3 comparison(s) at --max-divergence 5.0%: 1 passed, 2 failed" in proc.stderr
    proc = _gate(tmp_path, "--max-divergence", "0.5", "--comparison", "order")
    assert proc.returncode == 0 and "1 comparison(s)" in proc.stderr


def test_what_the_gate_cannot_judge_has_its_own_code_never_a_pass(tmp_path):
    import pyarrow.parquet as pq

    rows = [_floor(0), _row("quiet", 0, cell_a="base")]
    outcomes = {r["pair_id"]: ([f"p{i}" for i in range(N)], set()) for r in rows}
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
    # an edited declaration in the metadata (a stricter run's gate loosened): its digest refuses it
    import json

    _write(tmp_path, judged, gate={"max_divergence": 0.01})
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"tokenflip"])
    meta["gate"]["max_divergence"] = 1.0
    pq.write_table(table.replace_schema_metadata({b"tokenflip": json.dumps(meta).encode()}), path)
    proc = _gate(tmp_path)
    assert proc.returncode == 4 and "meta_sha256" in proc.stderr and str(path) in proc.stderr
    # counts that are no counts, and a declared bound that is not a share
    for bad in ({"n_prompts": float("nan")}, {"n_diverged": N + 1}, {"n_prompts": -1}):
        _write(tmp_path, [judged[0], {**judged[1], **bad}])
        proc = _gate(tmp_path, "--max-divergence", "0.05")
        assert proc.returncode == 4 and "comparison 'concurrency: quiet'" in proc.stderr, (bad, proc.stderr)
    # counts the interval was not made from (written with fresh digests: what a forger can do)
    import json as _json

    forged = _json.dumps([{"n": N, "only_comparison": 10 ** 9, "neither_or_both": 0, "only_floor": 0}])
    _write(tmp_path, [judged[0], {**judged[1], "floors_paired": forged}])
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "do not add up" in proc.stderr, proc.stderr
    # counts that add up but are not the cells' outcomes: 3 parted here and none only here says
    # they parted on the floor too, whose own row parted on none; 5 only here of 3 parted
    floor_id = judged[0]["pair_id"]
    held = _json.dumps([{"floor": floor_id, "n": N, "only_comparison": 0, "neither_or_both": N, "only_floor": 0}])
    _write(tmp_path, [judged[0], {**judged[1], "n_diverged": 3, "floors_paired": held}])
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and f"say its floor {floor_id} parted on 3 of 200, and the floor's own row on 0" \
        in proc.stderr, proc.stderr
    more = _json.dumps([{"floor": floor_id, "n": N, "only_comparison": 5, "neither_or_both": N - 5, "only_floor": 0}])
    span = interval(5, N - 5, 0, judged[1]["intervals"])  # the interval these counts give: only the pairing is off
    _write(tmp_path, [judged[0], {**judged[1], "n_diverged": 3, "floors_paired": more, "interval_low": span[0],
                                  "interval_high": span[1]}])
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "do not hold its own 3 of 200 parted" in proc.stderr, proc.stderr
    _write(tmp_path, [judged[0], {**judged[1], "interval_high": 0.001}])
    proc = _gate(tmp_path, "--max-divergence", "0.05")
    assert proc.returncode == 4 and "its counts give" in proc.stderr, proc.stderr
    for gate in (["max_divergence", 0.05], "engine"):
        _write(tmp_path, judged, gate=gate)
        proc = _gate(tmp_path)
        assert proc.returncode == 4 and "not a mapping" in proc.stderr and "Traceback" not in proc.stderr
    _write(tmp_path, judged, gate={"max_divergence": 0.05, "comparisons": "engine"})
    proc = _gate(tmp_path)
    assert proc.returncode == 4 and "not a list of names" in proc.stderr
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
