"""`tokenflip gate RUN [--max-divergence X]`: a run's comparisons as a release decision in CI
(the bound given, or the `gate` block the study's config declares). Each comparison's
divergence above its noise floor (paired with it prompt by prompt, against each floor, as
the verdicts are: `analysis/paired.py`; a comparison without a floor, on its own rate) is:

- **fail** where it is shown to exceed X (Tango's one-sided score test at α, Holm-adjusted
  across the comparisons gated), or where accuracy dropped significantly (b below a, exact
  McNemar p < α); with X = 0, where any prompt parted that its floor did not (zero tolerance);
- **pass** where it is shown to be at most X (the upper end of its two-sided 1 − 2α interval);
- **inconclusive** otherwise, with the prompts that would likely decide it;
- **missing** where a cell of it did not finish: nothing was measured, so it is not judged.

Exit 0: every comparison passed; 1: one failed; 3: none failed, one is inconclusive; 2: a
usage error; 4: none failed and the gate cannot judge what it was asked (the run's summary
cannot be read, holds nothing to gate, or a comparison gated has a cell missing). The noise floors
(repeat pairs) are gated only where `--comparison` names them, on their own rate. A JUnit XML file (one test case per
comparison: a failure, a pass, an inconclusive skip, or a missing comparison's error) is written for CI systems.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenflip.core.layout import gate_junit_of, summary_of

ALPHA = 0.05
UNREADABLE = 4
EXIT = {"pass": 0, "fail": 1, "inconclusive": 3, "missing": UNREADABLE}


@dataclass
class Outcome:
    result: str  # pass | fail | inconclusive | missing
    why: str
    p_fail: float | None = None  # the p-value of "above X" (Holm-adjusted across the run before use)
    figures: str = ""


def _floors(row: dict):
    from tokenflip.analysis.paired import PairedCounts

    text = row.get("floors_paired")
    return [PairedCounts(**c) for c in json.loads(text)] if isinstance(text, str) and text else []


def _prompts_to_decide(n: int, decides) -> str:
    """Roughly how many prompts a pair would decide it, were its rates to stay as they are:
    the fewest n' (searched geometrically, to 10^6) at which `decides(n')` holds."""
    size = n + 1
    while size <= 10 ** 6:
        if decides(size):
            return f"about {size} prompts a pair would decide it, were its rates to stay as they are"
        size = max(size + 1, int(size * 1.25))
    return "more than 10^6 prompts a pair would be needed, were its rates to stay as they are"


def judge_row(row: dict, bound: float, alpha: float = ALPHA, tested: int = 1) -> Outcome:
    """One done comparison against the bound, before the run-wide adjustment (over `tested`
    comparisons)."""
    from scipy.stats import binomtest
    from statsmodels.stats.proportion import proportion_confint

    from tokenflip.analysis.paired import p_excess_above, tango_interval

    k, n = int(row["n_diverged"]), int(row["n_prompts"])
    floors = _floors(row) if row.get("axis") != "repeat" else []
    if n == 0:
        return Outcome("inconclusive", "no prompt was compared")
    floor_itself = row.get("axis") == "repeat"
    if bound == 0:  # zero tolerance: any prompt that parted where its floor(s) did not
        above = min((f.only_comparison for f in floors), default=k)
        what = ("where its floor did not" if floors else
                "when the same setting ran again (a noise floor)" if floor_itself else "(no floor measured)")
        return Outcome("fail", f"{above} of {n} prompts parted {what}, above --max-divergence 0") if above else \
            Outcome("pass", f"no prompt parted {what}")
    if floors:
        spans = [tango_interval(f.only_comparison, f.only_floor, f.n, 2 * alpha) for f in floors]
        p_fail = max(p_excess_above(f.only_comparison, f.only_floor, f.n, bound) for f in floors)
        i = max(range(len(floors)), key=lambda j: spans[j][1])
        estimate, (low, high), what = floors[i].excess, spans[i], f"above its floor of {floors[i].floor_rate:.1%}"
        passed = all(hi <= bound for _, hi in spans)
        b, c, m = floors[i].only_comparison, floors[i].only_floor, floors[i].n

        def decides(size: int) -> bool:
            b2, c2 = round(b * size / m), round(c * size / m)
            if estimate > bound:
                return p_excess_above(b2, c2, size, bound) * tested <= alpha
            return tango_interval(b2, c2, size, 2 * alpha)[1] <= bound
    else:
        low, high = (float(v) for v in proportion_confint(k, n, alpha=2 * alpha, method="beta"))
        p_fail, estimate = float(binomtest(k, n, bound, alternative="greater").pvalue), k / n
        what = "(a noise floor, on its own rate)" if floor_itself else "(no floor)"
        passed = high <= bound

        def decides(size: int) -> bool:
            k2 = round(k * size / n)
            if estimate > bound:
                return float(binomtest(k2, size, bound, alternative="greater").pvalue) * tested <= alpha
            return float(proportion_confint(k2, size, alpha=2 * alpha, method="beta")[1]) <= bound
    figures = f"{k} of {n} parted; {estimate:+.1%} {what}, {1 - 2 * alpha:.0%} interval {low:+.1%} to {high:+.1%}"
    if passed:
        return Outcome("pass", f"{figures}: at most --max-divergence {bound:.1%}", p_fail, figures)
    return Outcome("inconclusive", f"{figures}: neither shown above nor at most --max-divergence {bound:.1%}; "
                                   f"{_prompts_to_decide(n, decides)}", p_fail, figures)


def outcomes(rows: list[dict], bound: float, alpha: float = ALPHA) -> list[Outcome]:
    """Every row's outcome, "above X" decided by Holm's adjustment across the done rows."""
    from statsmodels.stats.multitest import multipletests

    tested = max(1, sum(r["status"] == "done" and int(r["n_prompts"]) > 0 for r in rows))
    out = [judge_row(r, bound, alpha, tested) if r["status"] == "done" else
           Outcome("missing", f"{r['status']}: a cell of this comparison did not finish ({_cells(r)}); "
                              f"nothing to judge") for r in rows]
    tested = [i for i, o in enumerate(out) if o.p_fail is not None]
    if tested:
        adjusted = multipletests([out[i].p_fail for i in tested], alpha=alpha, method="holm")[1]
        for i, p in zip(tested, adjusted):
            if p <= alpha:
                out[i] = Outcome("fail", f"{out[i].figures}: above --max-divergence {bound:.1%} (Holm-adjusted p = "
                                 f"{p:.3g} over {len(tested)} comparisons)", out[i].p_fail, out[i].figures)
    for o, row in zip(out, rows):
        if row["status"] == "done" and row["accuracy_b"] < row["accuracy_a"] and row["mcnemar_p"] < alpha:
            drop = (f"accuracy dropped from {row['accuracy_a']:.1%} to {row['accuracy_b']:.1%} "
                    f"(McNemar p = {row['mcnemar_p']:.3g})")
            o.why = drop if o.result != "fail" else f"{o.why}; {drop}"
            o.result = "fail"
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
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

    from tokenflip.analysis.summary import ResultError
    from tokenflip.core.storage import read_table

    path = summary_of(args.run, "pairs")
    if not path.is_file():
        _unreadable(f"{path}: no summary of pairs (run the study to its summary first: `make run`)")
    try:  # its digest checked, as every reader of a result checks it: an edited row is never gated
        table, meta = read_table(path, kind="summary")
        pairs = table.to_pandas()
    except Exception as exc:  # noqa: BLE001 - a truncated, edited or foreign file: its own message and code
        _unreadable(f"{path}: not a readable summary of pairs ({type(exc).__name__}: {exc})")
    if "floors_paired" not in pairs.columns:
        _unreadable(f"{path}: summarised before verdicts were paired prompt by prompt; summarise it again")
    declared = declared_gate(path)
    bound = args.max_divergence if args.max_divergence is not None else declared.get("max_divergence")
    if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                  and 0 <= bound <= 1):  # NaN fails both comparisons
        _unreadable(f"{path}: the study declares gate.max_divergence {bound!r}, not a share from 0 to 1")
    if bound is None:
        raise ResultError(f"{path}: no bound to gate on: give --max-divergence, or declare one in the study's config "
                          f"(gate: {{max_divergence: 0.05}}) and summarise it again")
    comparisons = args.comparison or (declared.get("comparisons") if args.max_divergence is None else None)
    if comparisons:
        pairs = pairs[pairs["axis"].isin(comparisons) | pairs["label"].isin(comparisons)]
        if pairs.empty:
            raise ResultError(f"{path}: no comparison matches {comparisons} (axes or labels such as "
                              f"'concurrency: default vs 8')")
    else:  # the noise floors are what the comparisons are judged against, gated only where named
        pairs = pairs[pairs["axis"] != "repeat"]
    if pairs.empty:
        _unreadable(f"{path}: no comparison to gate (the summary holds only noise floors, or none)")
    rows = pairs.to_dict("records")
    if (why := unreadable_row(rows)) is not None:
        _unreadable(f"{path}: {why}")
    try:
        results = outcomes(rows, bound)
    except (KeyError, TypeError, ValueError) as exc:  # a column of another meaning: said, never gated
        _unreadable(f"{path}: not a summary of pairs this gate can read ({type(exc).__name__}: {exc})")
    suite = TestSuite(f"tokenflip gate {Path(args.run).name}")
    for row, outcome in zip(rows, results):
        case = TestCase(row["pair_id"], classname=row["label"])
        if outcome.result == "fail":
            case.result = [Failure(outcome.why, type_="tokenflip.gate")]
        elif outcome.result == "inconclusive":
            case.result = [Skipped(f"inconclusive: {outcome.why}")]
        elif outcome.result == "missing":
            case.result = [Error(outcome.why, type_="tokenflip.gate.missing")]
        case.system_out = _verdict(row)
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    out = Path(args.junit or gate_junit_of(args.run))
    xml.write(str(out), pretty=True)
    counts = {r: sum(o.result == r for o in results) for r in EXIT}
    print(f"tokenflip gate: {len(rows)} comparison(s) at --max-divergence {bound:.1%}: {counts['pass']} passed, "
          f"{counts['fail']} failed, {counts['inconclusive']} inconclusive, {counts['missing']} not judged (a cell "
          f"missing); JUnit: {out}", file=sys.stderr)
    for row, outcome in zip(rows, results):
        if outcome.result != "pass":
            verdict = _verdict(row) or "none"
            print(f"{outcome.result.upper()} {row['label']} [{row['context']}]: {outcome.why}; verdict: {verdict}",
                  file=sys.stderr)
    result = next((r for r in ("fail", "missing", "inconclusive") if counts[r]), "pass")
    if result == "missing":
        print(f"tokenflip gate: error: {counts['missing']} comparison(s) gated have a cell that did not finish: "
              f"finish the run (`make run`, or snakemake --keep-going to see why) or gate the others with "
              f"--comparison", file=sys.stderr)
    if EXIT[result]:
        raise SystemExit(EXIT[result])


def unreadable_row(rows: list[dict]) -> str | None:
    """Why a pairs table cannot be gated (None if it can): a row without its identity or
    status, or a finished row whose counts are not whole numbers with parted ≤ compared."""
    import math

    for i, row in enumerate(rows):
        if not all(isinstance(row.get(key), str) for key in ("pair_id", "label", "status")):
            return f"row {i} has no pair id, label or status"
        if row["status"] != "done":
            continue
        counts = [row.get("n_prompts"), row.get("n_diverged")]
        if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c >= 0
                   and c == int(c) for c in counts) or counts[1] > counts[0]:
            return (f"comparison {row['label']!r} ({row['pair_id']}): its counts {counts} are not prompts compared "
                    f"and parted; summarise the run again")
    return None


def _cells(row: dict) -> str:
    return " vs ".join(str(row.get(key, "?")) for key in ("cell_a", "cell_b"))


def _verdict(row: dict) -> str:
    """The row's verdict in words ("" where it has none: an unfinished comparison)."""
    return next((v for v in (row.get("verdict_words"), row.get("verdict")) if isinstance(v, str) and v), "")


def _unreadable(message: str):
    print(f"tokenflip gate: error: {message}", file=sys.stderr)
    raise SystemExit(UNREADABLE)


def add_command(sub) -> None:
    from tokenflip.cli.args import number, path_arg

    p = sub.add_parser("gate", help="a run's comparisons against a bound: pass (exit 0) where each is shown at "
                                    "most the bound above its noise floor, fail (1) where one is shown above it or "
                                    "loses accuracy significantly, inconclusive (3) otherwise, 4 where it cannot "
                                    "judge (a cell missing, an unreadable summary); writes JUnit XML")
    path_arg(p, "run", kind="dir", help="the run's results directory (results/<run>)")
    p.add_argument("--max-divergence", type=number(0, 1, "(a share of prompts)"),
                   help="the largest share of prompts allowed to part above the noise floor (0.05 = 5%%; 0: none, "
                        "zero tolerance); default: the study's `gate.max_divergence`, with its `gate.comparisons`")
    p.add_argument("--comparison", nargs="+",
                   help="only these comparisons: axes, or labels as the report shows them (replaces the study's "
                        "`gate.comparisons`; a --max-divergence given without it gates every comparison)")
    path_arg(p, "--junit", kind="out", help="the JUnit XML file to write (default: RUN/gate.junit.xml)")
    p.set_defaults(func=cmd_gate)
