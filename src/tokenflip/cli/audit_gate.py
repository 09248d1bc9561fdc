"""An audit as a CI step: `tokenflip audit ... --gate X` runs rounds (the one decision rule)
until every comparison is shown at most X or above X above its noise floor, or its budget
(prompts, time) is spent, and exits with the gate's code. Before any request it says what
the budget can decide, and refuses one that cannot decide even a deployment that never parts
(unless `--go-on`). A cell that could not be measured ends the audit with exit 4, naming it
and why, never with the scheduler's own code.

Exit codes (one table, docs/endpoints.md): 0 pass, 1 fail, 2 usage, 3 inconclusive, 4 a cell
that could not be measured or a summary that cannot be read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The first round's prompts, and the multiple every maximum is rounded up to.
FIRST_BLOCK = 16


def unmeasurable(message: str):
    """The error of a deployment that cannot be measured as asked (nothing answers, another
    model, another tokenizer): exit 4, where a usage error of the audit's own exits 2."""
    from tokenflip.study.config import ConfigError

    error = ConfigError(message)
    error.exit_code = 4
    return error


def families(args) -> tuple[int, int]:
    """(judged comparisons, pairs) of the audit's study, counted from its arguments before any
    request (a server whose kind is not given may take a cache salt: counted, so the estimate
    errs long): concurrency, load and logprobs against the first's own repeat; its prefix
    cache cold vs warm; the second deployment and the reference, each against the first."""
    from tokenflip.models.servers import server

    judged = 3 + (args.server is None or server(args.server).cache_salt is not None) + bool(args.against) \
        + (args.reference != "none")
    return judged, judged + 1 + bool(args.against)


def prompts_needed_at(args) -> int | None:
    """The fewest prompts at which the rule shows a deployment that never parts within the gate
    (even odds, exact over counts)."""
    from tokenflip.analysis.decision import MARGIN, prompts_needed

    judged, intervals = families(args)
    return prompts_needed(0.0, 0.0, "gate", bound=args.gate, margin=MARGIN, intervals=intervals, judged=judged)


def check_budget(args) -> int:
    """The audit's most prompts a comparison may take under `--gate`: `--prompts`, else twice
    what a deployment that never parts needs, rounded up to a block; said before any request,
    and refused where it cannot show even that (unless `--go-on`)."""
    from tokenflip.study.config import ConfigError

    need = prompts_needed_at(args)
    most = args.prompts or -(-2 * (need or FIRST_BLOCK) // FIRST_BLOCK) * FIRST_BLOCK
    if args.prompts_file:  # a file's records are all it has (read here: a file, no request)
        from tokenflip.run.benchmarks.sources import Source, load_records

        most = min(most, len(load_records("--prompts-file", Source(path=Path(args.prompts_file)))))
    judged, intervals = families(args)
    print(f"tokenflip audit: --gate {args.gate:g}: at least {need or 'more than 100,000'} prompts to show ≤ "
          f"{args.gate:.0%} above the noise floor on a deployment that never parts ({judged} comparisons judged, "
          f"{intervals} intervals at once); this audit takes at most {most} a comparison"
          + (f" and {args.budget} of its cells' jobs" if args.budget else ""), file=sys.stderr)
    if (need is None or most < need) and not args.go_on:
        given = f"--prompts {most}" if args.prompts else f"{args.prompts_file}'s {most} records"
        raise ConfigError(f"{given} cannot decide the gate at {args.gate:g}: even a deployment that never "
                          f"parts needs {need or 'more than 100,000'} prompts to be shown within it; give --prompts "
                          f"{need or 100000} or more, a larger --gate, or --go-on to run it anyway")
    return most


def with_gate(config: dict[str, Any], args, most: int) -> dict[str, Any]:
    """The audit's study deciding in rounds up to `most` prompts (and `--budget`) until the gate
    at `--gate` is decided for every comparison."""
    rounds = {"max_prompts": most, **({"budget": args.budget} if args.budget else {})}
    # The built-in prompts are made to order: as many as the rounds may take (a benchmark's n
    # caps its rounds too); a prompts file has what it has.
    benchmarks = {name: {**spec, "n": most} if spec["kind"] != "prompts" else spec
                  for name, spec in config["benchmarks"].items()}
    return {**config, "benchmarks": benchmarks, "blocks": {"first": min(FIRST_BLOCK, most)}, "rounds": rounds,
            "gate": {"max_divergence": args.gate}}


def unmeasured(config: dict[str, Any], root: str = ".") -> list[tuple[str, str]]:
    """Each planned cell whose file is missing, with the last line its job's log holds (its
    error), redacted of any key."""
    from tokenflip.core.excerpt import redacted
    from tokenflip.core.layout import RunLayout
    from tokenflip.study.plan import expand_cells

    layout = RunLayout(config["run"], root=root)
    out = []
    for cell in expand_cells(config):
        if Path(layout.cell(cell.id)).is_file():
            continue
        whole = Path(layout.log("generate", cell.id))  # the cell's job, or its blocks' (<cell>/<first>-<end>.log)
        logs = sorted([whole] * whole.is_file() + list(whole.with_suffix("").glob("*.log")),
                      key=lambda p: p.stat().st_mtime)
        lines = [line for line in (logs[-1].read_text(errors="replace").splitlines() if logs else []) if line.strip()]
        why = redacted(lines[-1].strip())[:300] if lines else "its job did not run (see Snakemake's output above)"
        out.append((cell.id, why))
    return out


def finish(config: dict[str, Any], args, code: int) -> None:
    """End the audit with an exit code CI reads: 4 naming each cell that could not be measured;
    with `--gate`, the gate's code; else 0."""
    if code != 0:
        missing = unmeasured(config)
        for cell_id, why in missing:
            print(f"tokenflip audit: cell {cell_id} could not be measured: {why}", file=sys.stderr)
        if not missing:
            print(f"tokenflip audit: the run stopped (Snakemake exit {code}) with every cell measured: see its "
                  f"output above", file=sys.stderr)
        raise SystemExit(4)
    if args.gate is not None:
        import argparse

        from tokenflip.cli.gate import cmd_gate

        cmd_gate(argparse.Namespace(run=str(Path("results") / config["run"]), max_divergence=args.gate,
                                    comparison=None, junit=None))
