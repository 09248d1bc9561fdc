"""Every number a cell stores per step is a number: logits that are NaN or infinite (a
checkpoint gone bad, a config override such as a negative `rope_theta` or `rms_norm_eps`)
fail the cell, naming the step and the prompt, instead of being written as tokens chosen by
argmax over NaN and compared with other cells as if they were values."""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenflip.models.prepare import ModelError

# The per-step fields of a cell's rows that come from the logits (see `storage.cell_schema`).
STEP_FIELDS = ("top_logits", "logsumexp", "margin", "entropy")


class NonFiniteLogits(ModelError):
    """A cell's logits were not finite: the cell is not written (a model error, so the command
    line says it in one line)."""


def require_finite(records: list[dict[str, Any]], cell_id: str, skip: tuple[str, ...] = ()) -> None:
    """Raise `NonFiniteLogits` at the first prompt (in prompt order) with a step whose logits
    statistics are NaN or infinite, naming the cell, the prompt, the step (0 = the first
    generated token) and the value. Every engine's rows pass here before a cell is written;
    `skip` names the fields an engine does not record (vLLM returns no full-vocabulary
    log-sum-exp or entropy)."""
    for row in sorted(records, key=lambda r: r["prompt_index"]):
        bad: list[tuple[int, int, str, float]] = []
        for order, name in enumerate(f for f in STEP_FIELDS if f not in skip):
            values = np.asarray(row[name], dtype=np.float64)
            values = values.reshape(len(values), -1) if values.size else values.reshape(0, 1)
            steps = np.flatnonzero(~np.isfinite(values).all(axis=1))
            if steps.size:
                step = int(steps[0])
                bad.append((step, order, name, float(values[step][~np.isfinite(values[step])][0])))
        if bad:
            step, _, name, value = min(bad)
            raise NonFiniteLogits(
                f"cell {cell_id}: the logits are not finite at step {step} (0 = the first generated token) of prompt "
                f"{row['prompt_id']!r} (index {row['prompt_index']}): {name} is {value}. The model's forward pass "
                "yields NaN or inf (a bad checkpoint, or a config override such as a negative rope_theta or "
                "rms_norm_eps); no cell is written, since its tokens would be chosen among NaN and compared as "
                "numbers.")
