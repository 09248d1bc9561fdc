"""The interventions table (paper 2, Table 3 and Table 4): each intervention against no
intervention (an entry of kind `none`, whatever its label) for the same precision pair and
every other axis equal."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokenflip.core.axes import AXES
from tokenflip.core.specs import Pair
from tokenflip.run.interventions import no_intervention_labels
from tokenflip.study.plan import expand_cells, expand_pairs


def _paired_bootstrap(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """90% percentile interval of mean(x - y) over prompts resampled in pairs."""
    from scipy.stats import bootstrap

    if len(x) < 2 or not np.any(x != y):
        return (float(np.mean(x - y)),) * 2 if len(x) else (float("nan"), float("nan"))
    ci = bootstrap((x, y), lambda u, v, axis=-1: np.mean(u - v, axis=axis), paired=True, confidence_level=0.9,
                   n_resamples=2000, method="percentile", random_state=np.random.default_rng(0),
                   vectorized=True).confidence_interval
    return float(ci.low), float(ci.high)


def intervention_rows(config: dict[str, Any], agreement: dict[str, pd.DataFrame], cells: pd.DataFrame,
                      metas: dict[str, dict] | None = None, pairs: list[Pair] | None = None) -> list[dict[str, Any]]:
    """Each intervention against no intervention for the same precision pair and every
    other axis equal: exact agreement, lift with a paired bootstrap 90% interval, exact
    McNemar on agreement, trigger rate and the per-token compute overhead of the two
    cells (paper Table 3, per batch size); and the prompts that diverged without it,
    split as in the paper's Table 4 (§6.3): the intervention fired on them (in either
    cell) and reconciled the pair, fired without reconciling it, or never fired."""
    metas = metas or {}
    from tokenflip.analysis.statistics import mcnemar_exact

    groups: dict[tuple, dict[str, Pair]] = {}
    for pair in pairs if pairs is not None else expand_pairs(config, expand_cells(config)):
        if pair.axis == "precision":
            key = tuple(pair.shared()[axis] for axis in ("model", "benchmark", *AXES)
                        if axis not in ("precision", "intervention")) + (pair.a.precision, pair.b.precision)
            groups.setdefault(key, {})[pair.a.intervention] = pair
    per_token = cells.set_index("cell_id")["seconds_per_token"].to_dict() if "seconds_per_token" in cells else {}
    trig = cells.set_index("cell_id")["trigger_rate"].to_dict() if "trigger_rate" in cells else {}
    rows = []
    none = no_intervention_labels(config)
    for group in (groups[k] for k in sorted(groups)):
        baseline = next((group[label] for label in none if label in group), None)
        if baseline is None or len(group) < 2 or baseline.id not in agreement:
            continue
        base = agreement[baseline.id]
        base_cost = per_token.get(baseline.a.id, np.nan) + per_token.get(baseline.b.id, np.nan)
        for name, pair in sorted(group.items()):
            row = {**{k: v for k, v in pair.shared().items() if k != "intervention"}, "a": pair.a.precision,
                   "b": pair.b.precision, "intervention": name, "baseline": name in none, "pair_id": pair.id,
                   "status": "done" if pair.id in agreement else "missing"}
            if pair.id in agreement:
                joined = base.add_suffix("_base").join(agreement[pair.id].add_suffix("_int"), how="inner")
                x, y = joined["agree_int"].to_numpy(float), joined["agree_base"].to_numpy(float)
                lo, hi = _paired_bootstrap(x, y)
                cost = per_token.get(pair.a.id, np.nan) + per_token.get(pair.b.id, np.nan)
                row.update(n=len(joined), ear=float(np.mean(x)), lift=float(np.mean(x - y)), lift_ci_low=lo,
                           lift_ci_high=hi, mcnemar_p=mcnemar_exact(x.astype(bool), y.astype(bool)),
                           trigger_rate=float(np.nanmean([trig.get(pair.a.id, np.nan),
                                                          trig.get(pair.b.id, np.nan)])),
                           overhead=float(cost / base_cost - 1) if base_cost else float("nan"),
                           **_table4(joined, metas, pair))
            rows.append(row)
    return rows


def _table4(joined: pd.DataFrame, metas: dict[str, dict], pair: Pair) -> dict[str, int]:
    """Baseline-diverged prompts by whether the intervention fired and reconciled them."""
    fired = set().union(*(metas.get(c.id, {}).get("_triggered", set()) for c in (pair.a, pair.b)))
    diverged = joined[~joined["agree_base"].astype(bool)]
    hit = diverged.index.isin(list(fired))
    reconciled = diverged["agree_int"].astype(bool).to_numpy()
    return {"n_base_diverged": int(len(diverged)), "n_triggered_reconciled": int((hit & reconciled).sum()),
            "n_triggered_not_reconciled": int((hit & ~reconciled).sum()), "n_not_triggered": int((~hit).sum())}
