"""`tokenflip gate RUN [--max-divergence X]`: a run's comparisons as a CI gate (the bound given,
or the `gate` block the study's config declares). A comparison
fails when its divergence is above X with confidence (the lower end of its 95% Wilson
interval is above X), or when its accuracy dropped significantly (b below a, exact McNemar
p < 0.05); the command exits 1 naming each failing comparison, its verdict and its figures,
and writes a JUnit XML file (one test case per comparison) that CI systems display.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenflip.core.layout import gate_junit_of, summary_of

ALPHA = 0.05


def failures(row: dict, max_divergence: float) -> list[str]:
    """Why a done comparison fails the gate (none: it passes)."""
    out = []
    if row["divergence_ci_low"] > max_divergence:
        out.append(f"divergence {row['divergence_rate']:.1%} ({int(row['n_diverged'])} of {int(row['n_prompts'])}; "
                   f"95% CI {row['divergence_ci_low']:.1%}–{row['divergence_ci_high']:.1%}) is above "
                   f"--max-divergence {max_divergence:.1%} with confidence")
    if row["accuracy_b"] < row["accuracy_a"] and row["mcnemar_p"] < ALPHA:
        out.append(f"accuracy dropped from {row['accuracy_a']:.1%} to {row['accuracy_b']:.1%} "
                   f"(McNemar p = {row['mcnemar_p']:.3g})")
    return out


def declared_gate(path: Path) -> dict:
    """The `gate` block of the config the summary was made from ({} where none was declared,
    or the file carries no tokenflip provenance)."""
    from tokenflip.core.storage import StorageError, read_metadata

    try:
        return read_metadata(path).get("gate") or {}
    except StorageError:
        return {}


def cmd_gate(args) -> None:
    import pandas as pd
    from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite

    from tokenflip.analysis.summary import ResultError

    path = summary_of(args.run, "pairs")
    if not path.is_file():
        raise ResultError(f"{path}: no summary of pairs (run the study to its summary first: `make run`)")
    pairs = pd.read_parquet(path)
    declared = declared_gate(path)
    max_divergence = args.max_divergence if args.max_divergence is not None else declared.get("max_divergence")
    if max_divergence is None:
        raise ResultError(f"{path}: no bound to gate on: give --max-divergence, or declare one in the study's config "
                          f"(gate: {{max_divergence: 0.05}}) and summarise it again")
    comparisons = args.comparison or (declared.get("comparisons") if args.max_divergence is None else None)
    if comparisons:
        pairs = pairs[pairs["axis"].isin(comparisons) | pairs["label"].isin(comparisons)]
        if pairs.empty:
            raise ResultError(f"{path}: no comparison matches {comparisons} (axes or labels such as "
                              f"'concurrency: default vs 8')")
    suite = TestSuite(f"tokenflip gate {Path(args.run).name}")
    failed = []
    for row in pairs.to_dict("records"):
        case = TestCase(row["pair_id"], classname=row["label"])
        verdict = row.get("verdict_words") or row.get("verdict") or ""
        if row["status"] != "done":
            case.result = [Skipped(f"{row['status']}: a cell of this comparison did not finish")]
        else:
            why = failures(row, max_divergence)
            if why:
                case.result = [Failure("; ".join(why), type_="tokenflip.gate")]
                failed.append(f"{row['label']} [{row['context']}]: {'; '.join(why)}; verdict: {verdict}")
            case.system_out = verdict
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    out = Path(args.junit or gate_junit_of(args.run))
    xml.write(str(out), pretty=True)
    print(f"tokenflip gate: {len(pairs)} comparison(s), {len(failed)} failed; JUnit: {out}", file=sys.stderr)
    for line in failed:
        print(f"FAIL {line}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


def add_command(sub) -> None:
    from tokenflip.cli.args import number, path_arg

    p = sub.add_parser("gate", help="fail (exit 1) when a comparison of a run diverges above a bound with "
                                    "confidence or loses accuracy significantly; writes JUnit XML for CI")
    path_arg(p, "run", kind="dir", help="the run's results directory (results/<run>)")
    # Above 0: a bound of 0 would fail on any one prompt's divergence, which 1e-6 does too.
    p.add_argument("--max-divergence", type=number(1e-6, 1, "(a share of prompts)"),
                   help="the largest share of prompts allowed to part, above 0 (0.05 = 5%%); default: the "
                        "study's `gate.max_divergence`, with its `gate.comparisons`")
    p.add_argument("--comparison", nargs="+", help="only these comparisons: axes, or labels as the report shows them")
    path_arg(p, "--junit", kind="out", help="the JUnit XML file to write (default: RUN/gate.junit.xml)")
    p.set_defaults(func=cmd_gate)
