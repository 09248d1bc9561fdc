"""`tokenflip gate`: fails where it should (divergence above the bound with confidence, or
accuracy dropped significantly), passes where it should, names the comparison, its verdict
and its figures, and writes a JUnit file that a JUnit parser loads."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from junitparser import JUnitXml

from tokenflip.analysis.verdict import with_verdicts


def _row(label, n_diverged, n=64, acc_a=0.5, acc_b=0.5, mcnemar_p=1.0, axis="concurrency", status="done"):
    from tokenflip.analysis.statistics import wilson

    lo, hi = wilson(n_diverged, n)
    return {"pair_id": f"m/b/{axis}/{label}/ctx", "label": f"{axis}: {label}", "axis": axis, "context": "ctx",
            "cell_a": f"{label}-a", "cell_b": f"{label}-b", "status": status, "n_prompts": n,
            "n_diverged": n_diverged, "divergence_rate": n_diverged / n, "divergence_ci_low": lo,
            "divergence_ci_high": hi, "accuracy_a": acc_a, "accuracy_b": acc_b, "mcnemar_p": mcnemar_p}


def _run(tmp_path, rows, *args):
    (tmp_path / "summary").mkdir(exist_ok=True)
    pd.DataFrame(with_verdicts(rows)).to_parquet(tmp_path / "summary" / "pairs.parquet")
    return subprocess.run([sys.executable, "-m", "tokenflip", "gate", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=300)


def test_the_gate_fails_on_divergence_above_the_bound_with_confidence_and_on_lost_accuracy(tmp_path):
    rows = [
        _row("quiet", 0),                      # nothing parted: passes any bound
        _row("noisy", 3),                      # 3 of 64: the interval reaches down to 1.6%, not above 5%
        _row("loud", 20),                      # 20 of 64: Wilson 95% CI 21.2%–43.4%, above 5% with confidence
        _row("worse", 2, acc_a=0.75, acc_b=0.25, mcnemar_p=0.001),   # accuracy fell, significantly
        _row("better", 2, acc_a=0.25, acc_b=0.75, mcnemar_p=0.001),  # rose: not a failure
        _row("lost", 0, status="missing"),
    ]
    proc = _run(tmp_path, rows, "--max-divergence", "0.05")
    assert proc.returncode == 1, proc.stderr
    failed = [line for line in proc.stderr.splitlines() if line.startswith("FAIL ")]
    assert len(failed) == 2
    assert failed[0].startswith("FAIL concurrency: loud [ctx]: divergence 31.2% (20 of 64; 95% CI 21.2%–43.4%) is "
                                "above --max-divergence 5.0% with confidence; verdict: no floor")
    assert "accuracy dropped from 75.0% to 25.0% (McNemar p = 0.001)" in failed[1]
    suites = JUnitXml.fromfile(str(tmp_path / "gate.junit.xml"))
    cases = {case.classname: case for suite in suites for case in suite}
    assert len(cases) == 6
    assert [type(r).__name__ for r in cases["concurrency: loud"].result] == ["Failure"]
    assert [type(r).__name__ for r in cases["concurrency: lost"].result] == ["Skipped"]
    assert cases["concurrency: quiet"].is_passed and cases["concurrency: better"].is_passed
    root = ET.parse(tmp_path / "gate.junit.xml").getroot()  # plain XML too: what CI systems read
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "2", "1")


def test_the_gate_passes_under_a_looser_bound_and_reads_only_the_comparisons_asked(tmp_path):
    rows = [_row("loud", 20), _row("again", 20, axis="repeat")]
    proc = _run(tmp_path, rows, "--max-divergence", "0.5", "--junit", str(tmp_path / "ci.xml"))
    assert proc.returncode == 0 and "2 comparison(s), 0 failed" in proc.stderr
    assert len(list(next(iter(JUnitXml.fromfile(str(tmp_path / "ci.xml")))))) == 2
    proc = _run(tmp_path, rows, "--max-divergence", "0.05", "--comparison", "repeat")
    assert proc.returncode == 1 and "FAIL repeat: again" in proc.stderr and "verdict: noise floor" in proc.stderr
    proc = _run(tmp_path, rows, "--max-divergence", "0.05", "--comparison", "precision")
    assert proc.returncode == 1 and "no comparison matches ['precision']" in proc.stderr


@pytest.mark.parametrize("bound", ["0", "-0.1", "1.5", "nan"])
def test_a_bound_that_is_not_a_share_is_refused(tmp_path, bound):
    proc = _run(tmp_path, [_row("quiet", 0)], "--max-divergence", bound)
    assert proc.returncode == 2 and "--max-divergence" in proc.stderr


def test_the_gate_a_study_declares_travels_with_its_summary(tmp_path):
    """`gate: {max_divergence, comparisons}` in the config: the summary carries it, and
    `tokenflip gate RUN` applies it where no bound is given; a bound given replaces it."""
    import pyarrow as pa

    from tokenflip.core import storage

    rows = with_verdicts([_row("loud", 20), _row("quiet", 0, axis="load"), _row("big", 20, axis="order")])
    (tmp_path / "summary").mkdir()
    path = tmp_path / "summary" / "pairs.parquet"

    def write(gate):
        storage.write_table(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), path,
                            {"kind": "summary", "table": "pairs", "run": "r", "gate": gate})

    def gate(*args):
        return subprocess.run([sys.executable, "-m", "tokenflip", "gate", str(tmp_path), *args], capture_output=True,
                              text=True, timeout=300)

    write(None)
    proc = gate()
    assert proc.returncode == 1 and "no bound to gate on: give --max-divergence" in proc.stderr
    write({"max_divergence": 0.5, "comparisons": ["concurrency", "load"]})
    proc = gate()  # 20 of 64 is not above 50% with confidence; "order" is not gated
    assert proc.returncode == 0 and "2 comparison(s), 0 failed" in proc.stderr, proc.stderr
    write({"max_divergence": 0.05})
    proc = gate()
    assert proc.returncode == 1 and "3 comparison(s), 2 failed" in proc.stderr
    proc = gate("--max-divergence", "0.5")  # given on the command line: the declared one is not read
    assert proc.returncode == 0 and "3 comparison(s), 0 failed" in proc.stderr
