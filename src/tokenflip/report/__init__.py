"""Render a run's summaries into one self-contained HTML file (figures inline as SVG).

`page` assembles the page from `figures`, `tables` and the `overview` heatmaps, which share
`common`; adding a figure touches `figures`, `page` and the template.
"""

import matplotlib

matplotlib.use("Agg")  # before any module imports pyplot: no display is needed or wanted

import seaborn as sns  # noqa: E402

sns.set_theme(style="whitegrid", context="paper")

from tokenflip.report.common import _fmt  # noqa: E402
from tokenflip.report.page import render, render_partial, write_tables  # noqa: E402
from tokenflip.report.tables import kv_claims, probe_claims  # noqa: E402

__all__ = ["render", "render_partial", "write_tables", "kv_claims", "probe_claims", "_fmt"]
