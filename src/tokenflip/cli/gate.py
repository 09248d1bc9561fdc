"""`tokenflip gate RUN [--max-divergence X]`: a run's comparisons as a release decision in CI
(the bound given, or the `gate` block the study's config declares). The gate computes no test
of its own: it reads each comparison's interval from the summary, the one the verdicts read
(`analysis.decision`: the excess over its noise floors, against every floor; a comparison
without a floor, and a floor gated by name, on its own rate), so it cannot contradict them:

- **fail** where the interval's lower end is above X, or where the summary shows accuracy
  dropped (e-BH over the comparisons scored);
- **pass** where its upper end is at most X;
- **inconclusive** otherwise, with the prompts that would decide it at the rates seen (the
  decision module's one estimate);
- **missing** where a cell of it did not finish: nothing was measured, so it is not judged.

Exit 0: every comparison passed; 1: one failed; 2: a usage error (no bound, an unknown
comparison); 3: none failed, one is inconclusive; 4: none failed and the gate cannot judge what
it was asked (the run's summary cannot be read, holds nothing to gate, or a comparison gated
has a cell missing). A JUnit XML file (one test case per comparison: a failure, a pass, an
inconclusive skip, or a missing comparison's error) is written for CI systems.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenflip.core.excerpt import excerpt
from tokenflip.core.inputs import loads_json
from tokenflip.core.layout import gate_junit_of, summary_of

USAGE = 2
UNREADABLE = 4
EXIT = {"pass": 0, "fail": 1, "inconclusive": 3, "missing": UNREADABLE}


@dataclass
class Outcome:
    result: str  # pass | fail | inconclusive | missing
    why: str


def _number(row: dict, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _rates(row: dict) -> tuple[float, float]:
    """The rates of +1 and −1 outcomes the row's interval was made from (its deciding floor's
    paired counts, or its own rate)."""
    from tokenflip.analysis.decision import deciding_counts

    text = row.get("floors_paired")
    if row.get("interval_of") == "excess" and isinstance(text, str) and text:
        counts = loads_json(text, "floors_paired")
        n = max(1, int(counts[0]["n"]))
        up, _, down = deciding_counts([(c["only_comparison"], c["neither_or_both"], c["only_floor"]) for c in counts])
        return up / n, down / n
    n = max(1, int(row["n_prompts"]))
    return int(row["n_diverged"]) / n, 0.0


def judge_row(row: dict, bound: float, intervals: int) -> Outcome:
    """One done comparison against the bound, from its interval in the summary."""
    from tokenflip.analysis.decision import prompts_needed

    k, n = int(row["n_diverged"]), int(row["n_prompts"])
    if n == 0:
        return Outcome("inconclusive", "no prompt was compared")
    low, high = _number(row, "interval_low"), _number(row, "interval_high")
    what = "above its noise floor" if row.get("interval_of") == "excess" else "(its own rate: no floor)"
    figures = f"{k} of {n} parted; {what} {low:+.1%} to {high:+.1%}"
    if row.get("accuracy_dropped") is True:
        drop = (f"accuracy dropped from {row['accuracy_a']:.1%} to {row['accuracy_b']:.1%} (e-BH over the "
                f"comparisons scored)")
        return Outcome("fail", f"{figures}; {drop}" + (f"; above --max-divergence {bound:.1%}" if low > bound else ""))
    if low > bound:
        return Outcome("fail", f"{figures}: above --max-divergence {bound:.1%}")
    if high <= bound:
        return Outcome("pass", f"{figures}: at most --max-divergence {bound:.1%}")
    up, down = _rates(row)
    needed = prompts_needed(up, down, "gate", start=n, bound=bound, intervals=intervals)
    more = (f"about {needed} prompts would decide it at the rates seen" if needed else
            "more than 100,000 prompts would be needed at the rates seen")
    return Outcome("inconclusive", f"{figures}: neither shown above nor at most --max-divergence {bound:.1%}; {more}")


def outcomes(rows: list[dict], bound: float) -> list[Outcome]:
    """Every row's outcome (the intervals' family: the summary's, at the level it states)."""
    intervals = max([1, *(int(r["intervals"]) for r in rows if _number(r, "intervals"))])
    return [judge_row(r, bound, intervals) if r["status"] == "done" else
            Outcome("missing", f"{r['status']}: a cell of this comparison did not finish ({_cells(r)}); "
                               f"nothing to judge") for r in rows]


def declared_gate(meta: dict) -> dict:
    """The `gate` block of the config the summary was made from ({} where none was declared);
    one that is not a mapping is unreadable."""
    gate = meta.get("gate") or {}
    return gate if isinstance(gate, dict) else {"malformed": gate}


def cmd_gate(args) -> None:
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

    from tokenflip.core.storage import read_table

    path = summary_of(args.run, "pairs")
    if not path.is_file():
        _unreadable(f"{path}: no summary of pairs (run the study to its summary first: `make run`)")
    try:  # its digest checked, as every reader of a result checks it: an edited row is never gated
        table, meta = read_table(path, kind="summary")
        pairs = table.to_pandas()
    except Exception as exc:  # noqa: BLE001 - a truncated, edited or foreign file: its own message and code
        _unreadable(f"{path}: not a readable summary of pairs ({type(exc).__name__}: {exc})")
    if "meta_sha256" not in meta:  # the declared gate is read from the metadata: never unchecked
        _unreadable(f"{path}: no meta_sha256 in its provenance (summarised by an older tokenflip): summarise again")
    if not {"interval_low", "interval_high", "intervals"} <= set(pairs.columns):
        _unreadable(f"{path}: summarised before every verdict came from one decision rule; summarise it again")
    declared = declared_gate(meta)
    if "malformed" in declared:
        _unreadable(f"{path}: the study declares a gate {excerpt(declared['malformed'])}, not a mapping")
    bound = args.max_divergence if args.max_divergence is not None else declared.get("max_divergence")
    if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                  and 0 <= bound <= 1):  # NaN fails both comparisons
        _unreadable(f"{path}: the study declares gate.max_divergence {bound!r}, not a share from 0 to 1")
    if bound is None:
        _usage(f"{path}: no bound to gate on: give --max-divergence, or declare one in the study's config "
               f"(gate: {{max_divergence: 0.05}}) and summarise it again")
    comparisons = args.comparison or (declared.get("comparisons") if args.max_divergence is None else None)
    if comparisons is not None and (not isinstance(comparisons, list)
                                    or not all(isinstance(c, str) for c in comparisons)):
        _unreadable(f"{path}: the study declares gate.comparisons {excerpt(comparisons)}, not a list of names")
    every_row = pairs.to_dict("records")  # the noise floors included, against which rows are checked
    if comparisons:
        pairs = pairs[pairs["axis"].isin(comparisons) | pairs["label"].isin(comparisons)]
        if pairs.empty:
            _usage(f"{path}: no comparison matches {comparisons} (axes or labels such as "
                   f"'concurrency: default vs 8')")
    else:  # the noise floors are what the comparisons are judged against, gated only where named
        pairs = pairs[pairs["axis"] != "repeat"]
    if pairs.empty:
        _unreadable(f"{path}: no comparison to gate (the summary holds only noise floors, or none)")
    rows = pairs.to_dict("records")
    if (why := unreadable_row(rows, every_row)) is not None:
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


def unreadable_row(rows: list[dict], every_row: list[dict] | None = None) -> str | None:
    """Why a pairs table cannot be gated (None if it can): a row without its identity or
    status, or a finished row whose counts are not whole numbers with parted ≤ compared, or
    whose interval or paired counts are not those its outcomes give."""
    floors = {row.get("pair_id"): row for row in (every_row or rows)
              if row.get("axis") == "repeat" and row.get("status") == "done"}
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
        ends = [_number(row, "interval_low"), _number(row, "interval_high")]
        if None in ends or not -1 <= ends[0] <= ends[1] <= 1 or not (_number(row, "intervals") or 0) >= 1:
            return (f"comparison {row['label']!r} ({row['pair_id']}): its interval {ends} is not an interval of a "
                    f"share; summarise the run again")
        if (why := _interval_disagrees(row, ends)
                or (_floor_disagrees(row, floors) if row.get("interval_of") == "excess" else None)) is not None:
            return f"comparison {row['label']!r} ({row['pair_id']}): {why}; summarise the run again"
    return None


def _floor_disagrees(row: dict, floors: dict[str, dict]) -> str | None:
    """Why a row's paired counts are not its cells' own outcomes (None where they are): on
    all its prompts, its parted prompts are those parted only here or on both, and its
    floor's (whose row the summary holds, on the same prompts) those parted only there or on
    both, so the two rows' counts and the pairing must agree."""
    k, n = int(row["n_diverged"]), int(row["n_prompts"])
    for entry in loads_json(row["floors_paired"], "floors_paired"):
        up, level, down, m = (int(entry[key]) for key in ("only_comparison", "neither_or_both", "only_floor", "n"))
        if m != n:
            continue  # decided at an earlier look: its counts are of fewer prompts
        if not (up <= k and k - up <= level):
            return f"its paired counts ({up}, {level}, {down}) do not hold its own {k} of {n} parted prompts"
        floor = floors.get(entry.get("floor"))
        if floor is not None and int(floor["n_prompts"]) == n and int(floor["n_diverged"]) != down + k - up:
            return (f"its paired counts ({up}, {level}, {down}) say its floor {entry['floor']} parted on "
                    f"{down + k - up} of {n}, and the floor's own row on {int(floor['n_diverged'])}")
    return None


def _interval_disagrees(row: dict, ends: list[float]) -> str | None:
    """Why the row's interval is not the one its own counts give (None where it is): the gate
    reads the interval, and checks it against the paired counts it was made from."""
    from tokenflip.analysis.decision import interval

    intervals, n = int(row["intervals"]), int(row["n_prompts"])
    if row.get("interval_of") == "excess":
        try:
            counts = [(int(c["only_comparison"]), int(c["neither_or_both"]), int(c["only_floor"]), int(c["n"]))
                      for c in loads_json(row["floors_paired"], "floors_paired")]
        except (TypeError, ValueError, KeyError):
            return "its paired counts are not counts"
        if not counts or any(min(c) < 0 or sum(c[:3]) != c[3] or c[3] > n for c in counts):
            return f"its paired counts {counts[:4]} do not add up to at most its {n} prompts"
        spans = [interval(u, lvl, w, intervals) for u, lvl, w, _ in counts]
        expected = [min(s[0] for s in spans), max(s[1] for s in spans)]
    elif row.get("interval_of") == "rate":
        k = int(row["n_diverged"])
        low, high = interval(k, n - k, 0, intervals)
        expected = [max(0.0, low), high]
    else:
        return f"its interval is of {excerpt(row.get('interval_of'))}, neither an excess nor a rate"
    if any(abs(a - b) > 1e-9 for a, b in zip(ends, expected)):
        return f"its interval {ends} is not the {expected} its counts give"
    return None


def _cells(row: dict) -> str:
    return " vs ".join(str(row.get(key, "?")) for key in ("cell_a", "cell_b"))


def _verdict(row: dict) -> str:
    """The row's verdict in words ("" where it has none: an unfinished comparison)."""
    return next((v for v in (row.get("verdict_words"), row.get("verdict")) if isinstance(v, str) and v), "")


def _usage(message: str):
    print(f"tokenflip gate: error: {message}", file=sys.stderr)
    raise SystemExit(USAGE)


def _unreadable(message: str):
    print(f"tokenflip gate: error: {message}", file=sys.stderr)
    raise SystemExit(UNREADABLE)


def add_command(sub) -> None:
    from tokenflip.cli.args import number, path_arg

    p = sub.add_parser("gate", help="a run's comparisons against a bound, read from the verdicts' own intervals: "
                                    "pass (exit 0) where each is shown at most the bound above its noise floor, "
                                    "fail (1) where one is shown above it or to lose accuracy, 2 on a usage error, "
                                    "inconclusive (3) otherwise, 4 where it cannot judge (a cell missing, an "
                                    "unreadable summary); writes JUnit XML")
    path_arg(p, "run", kind="dir", help="the run's results directory (results/<run>)")
    p.add_argument("--max-divergence", type=number(0, 1, "(a share of prompts)"),
                   help="the largest share of prompts allowed to part above the noise floor (0.05 = 5%%; 0: fail "
                        "only what is shown to part more than its floor); default: the study's "
                        "`gate.max_divergence`, with its `gate.comparisons`")
    p.add_argument("--comparison", nargs="+",
                   help="only these comparisons: axes, or labels as the report shows them (replaces the study's "
                        "`gate.comparisons`; a --max-divergence given without it gates every comparison)")
    path_arg(p, "--junit", kind="out", help="the JUnit XML file to write (default: RUN/gate.junit.xml)")
    p.set_defaults(func=cmd_gate)
