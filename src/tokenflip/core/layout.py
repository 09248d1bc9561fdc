"""The run layout: every path under results/, reports/, resources/ and logs/ is spelled here
and nowhere else. Rules, the summary, the report and `diff-runs` ask this module.

```
resources/models/{model}/                                       prepared model
results/{run}/cells/{model}/{benchmark}/{cell}.parquet          one cell (its blocks joined)
results/{run}/blocks/{model}/{benchmark}/{cell}/{first}-{end}.parquet   a block of its prompts
results/{run}/rounds/{round}.json                               what a round decided (rounds)
results/{run}/pairs/{model}/{benchmark}/{axis}/{a}_vs_{b}/{context}.parquet
results/{run}/probes/{model}/{benchmark}/{probe}/{table}.parquet
results/{run}/summary/{table}.parquet
reports/{run}/index.html, reports/{run}/tables/*.csv
reports/{run}/partial.html, reports/{run}/partial-tables/*.csv   after a failed run
results/{run}/checks/{model}/{benchmark}.json                  the model's tokenizer takes the prompts
logs/{run}/{rule}/...log
```

Paths are relative to the working directory (Snakemake's `--directory`) unless a `root`
is given. The same strings, with `{wildcards}`, are the rules' output patterns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = "resources/models"


@dataclass(frozen=True)
class RunLayout:
    """Where one run's files live. `root` is the working directory ('' = relative paths)."""

    run: str
    root: str = ""

    def _path(self, *parts: str) -> str:
        rel = "/".join(parts)
        return str(Path(self.root) / rel) if self.root else rel

    # --- results/{run} ----------------------------------------------------------------
    @property
    def results(self) -> str:
        return self._path("results", self.run)

    @property
    def cells_dir(self) -> str:
        return str(cells_dir_of(self.results))

    def cell(self, cell_id: str) -> str:
        """The cell file of `cell_id` (model/benchmark/name)."""
        return self._path("results", self.run, "cells", f"{cell_id}.parquet")

    def block(self, cell_id: str, first: int, end: int | None) -> str:
        """The block of prompts [first, end) of cell `cell_id` (end None: to the benchmark's last)."""
        return self._path("results", self.run, "blocks", cell_id, f"{first}-{'end' if end is None else end}.parquet")

    @property
    def blocks_plan(self) -> str:
        """Where each benchmark's blocks end and how rounds decide: a changed plan joins every cell again."""
        return self._path("results", self.run, "blocks", "plan.json")

    def round(self, number: int | str) -> str:
        """What round `number` (1, 2, ...) decided: the comparisons decided and the cells that go on."""
        return self._path("results", self.run, "rounds", f"{number}.json")

    def pair(self, pair_id: str) -> str:
        """The pair file of `pair_id` (model/benchmark/axis/a_vs_b/context)."""
        return self._path("results", self.run, "pairs", f"{pair_id}.parquet")

    def probe_dir(self, probe: str, model: str, benchmark: str) -> str:
        return self._path("results", self.run, "probes", model, benchmark, probe)

    def probe_table(self, probe: str, model: str, benchmark: str, table: str) -> str:
        return f"{self.probe_dir(probe, model, benchmark)}/{table}.parquet"

    def prompt_check(self, model: str, benchmark: str) -> str:
        """The record that a model's tokenizer takes a benchmark's prompts (see check-prompts)."""
        return self._path("results", self.run, "checks", model, f"{benchmark}.json")

    @property
    def summary_dir(self) -> str:
        return str(summary_dir_of(self.results))

    def summary(self, table: str) -> str:
        return str(summary_of(self.results, table))

    # --- reports/{run} ----------------------------------------------------------------
    @property
    def report(self) -> str:
        return self._path("reports", self.run, "index.html")

    @property
    def report_tables(self) -> str:
        return self._path("reports", self.run, "tables")

    @property
    def partial_report(self) -> str:
        """After a failed run: what did finish (never in place of the complete report)."""
        return self._path("reports", self.run, "partial.html")

    @property
    def partial_report_tables(self) -> str:
        return self._path("reports", self.run, "partial-tables")

    # --- logs/{run} ---------------------------------------------------------------------
    def log(self, rule: str, name: str) -> str:
        return self._path("logs", self.run, rule, f"{name}.log")

    # --- resources ----------------------------------------------------------------------
    def model_dir(self, model: str) -> str:
        return self._path(MODELS_DIR, model)

    # --- Snakemake patterns (wildcards in braces) --------------------------------------
    @property
    def cell_pattern(self) -> str:
        return self.cell("{model}/{benchmark}/{cell}")

    @property
    def block_pattern(self) -> str:
        return self._path("results", self.run, "blocks", "{model}", "{benchmark}", "{cell}", "{first}-{end}.parquet")

    @property
    def round_pattern(self) -> str:
        return self.round("{round}")

    @property
    def pair_pattern(self) -> str:
        return self.pair("{model}/{benchmark}/{axis}/{a}_vs_{b}/{context}")

    @property
    def prompt_check_pattern(self) -> str:
        return self.prompt_check("{model}", "{benchmark}")

    def probe_pattern(self, probe: str, table: str) -> str:
        return self.probe_table(probe, "{model}", "{benchmark}", table)

    @property
    def model_pattern(self) -> str:
        return self.model_dir("{model}")


def cell_ids_under(cells_dir: str | Path) -> dict[str, Path]:
    """Every cell file below a run's cells/ folder, by cell id (for runs from elsewhere)."""
    root = Path(cells_dir)
    return {str(p.relative_to(root))[: -len(".parquet")]: p for p in sorted(root.rglob("*.parquet"))}


def cells_dir_of(results_dir: str | Path) -> Path:
    """The cells folder of a run's results directory wherever it was copied (`diff-runs`)."""
    return Path(results_dir) / "cells"


def summary_dir_of(results_dir: str | Path) -> Path:
    """The summary folder of a run's results directory wherever it lies."""
    return Path(results_dir) / "summary"


def summary_of(results_dir: str | Path, table: str) -> Path:
    """A summary table of a run's results directory wherever it lies (`gate`)."""
    return summary_dir_of(results_dir) / f"{table}.parquet"


def gate_junit_of(results_dir: str | Path) -> Path:
    """Where `gate` writes its JUnit XML unless told otherwise: beside the run's summary."""
    return Path(results_dir) / "gate.junit.xml"
