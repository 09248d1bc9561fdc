"""The papers' figures beside this run's, each computed over the paper's own population.

Every row is data (`ROWS`): the claim, the paper's figure with its section, which summary
table it reads, which results count (axis values, the paper's models and benchmarks, the
models it left out) and the statistic, given per group (one model's figure, or a range
over models) as the paper gives it. One function (`comparison_rows`) computes them all.

Populations: a result enters a row only with every axis the row does not name at its
default (cache on, batch size 1, greedy, no intervention, default kernel, threads,
determinism, not a repeat): a `repeat` cell (§6.1) or an eager-attention cell is never a
second sample of the BF16-vs-FP16 rows. A row about named models (σz on TinyLlama) uses
those models where the run has them; where it has none of them, every model of the run
gets its own figure, labelled with what it stands in for ("smollm2-135m, in place of
TinyLlama"), never one number pooled over models the paper kept apart. Benchmarks alike.

`study` holds what the rows need to know, `rows` the rows, `statistics` and `formats`
what they compute and print, `compute` the one function that computes them all.
"""

from tokenflip.report.paper.compute import comparison_rows
from tokenflip.report.paper.rows import ROWS
from tokenflip.report.paper.study import (
    KV,
    PAPER_MODELS,
    PRECISION,
    SOURCES,
    Row,
    Study,
    Tables,
    gated_c_labels,
    graft_ends,
    paper_models,
)

__all__ = ["comparison_rows", "ROWS", "KV", "PAPER_MODELS", "PRECISION", "SOURCES", "Row", "Study", "Tables",
           "gated_c_labels", "graft_ends", "paper_models"]
