"""The report's live endpoints: one row per endpoint cell as its client measured it and as
its server said it is, the Provenance's engines (a server's identity, never the local
library in its place), and the findings about a server."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def _count(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def endpoint_rows(cells: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per finished cell of a live endpoint (a cell whose `endpoint_server` is set;
    every other engine's is null), as the *Live endpoints* table shows it: counts as integers,
    and what the server said it is (its model entry's id and `max_model_len`, the
    fingerprints of its answers)."""
    if cells.empty or "endpoint_server" not in cells:
        return []
    served = cells[(cells["status"] == "done") & cells["endpoint_server"].notna()].sort_values("cell_id")
    rows = []
    for record in served.to_dict("records"):
        c = {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in record.items()}
        rows.append({"cell_id": c["cell_id"], "server": c["endpoint_server"], "model": c.get("endpoint_model"),
                     "max_model_len": _count(c.get("endpoint_max_model_len")),
                     "fingerprints": c.get("endpoint_fingerprints"),
                     "in_flight_mean": c.get("in_flight_mean"), "in_flight_most": _count(c.get("in_flight_most")),
                     "background_in_flight_mean": c.get("background_in_flight_mean"),
                     "request_attempts": _count(c.get("request_attempts")), "scores": c.get("scores"),
                     "ids_from": c.get("ids_from"), "chat_template": c.get("chat_template"),
                     "not_top_choice_prompts": _count(c.get("not_top_choice_prompts")),
                     "not_top_choice_steps": c.get("not_top_choice_steps"),
                     "prompts_counted_otherwise": _count(c.get("prompts_counted_otherwise"))})
    return rows


def engine_rows(environment: dict[str, Any]) -> list[dict[str, Any]]:
    """The Provenance's engines: a local engine's package versions (transformers': the
    run's), a live endpoint's server (its kind and the version it reports at /version, the
    model entry it serves, with `max_model_len`, and the fingerprints and `server` headers of
    its answers), never the local library in its place."""
    rows = []
    for name, e in environment.get("engines", {}).items():
        e = e or {}
        if e.get("kind") == "endpoint":
            server = e.get("server") or {}
            reported = server.get("version")
            version = reported.get("version") if isinstance(reported, dict) else reported
            entry = server.get("model_entry") or {}
            build = [f"serves {entry['id']}" if entry.get("id") else "",
                     f"max_model_len {entry['max_model_len']}" if entry.get("max_model_len") is not None else "",
                     "fingerprints " + ", ".join(server["system_fingerprints"])
                     if server.get("system_fingerprints") else "no fingerprint",
                     *(f"{h} {', '.join(v)}" for h, v in (server.get("headers") or {}).items())]
            rows.append({"engine": name, "version": f"{e.get('server_kind', 'openai')} server "
                         + (str(version) if version else "(no version reported)"),
                         "build": "; ".join(filter(None, build)), "threads": None})
            continue
        package = e.get("package") or {}
        version = (", ".join(f"{dist} {v}" for dist, v in package.items()) if package else
                   f"transformers {environment.get('software', {}).get('transformers', '')}".strip())
        rows.append({"engine": name, "version": version, "build": e.get("system_info"), "threads": e.get("n_threads")})
    return rows


def endpoint_lines(cells: pd.DataFrame) -> list[str]:
    """Live endpoints that decoded otherwise than their own scores say (a finding about the
    server), or whose prompts they counted otherwise than tokenflip encoded them."""
    if cells.empty or "not_top_choice_prompts" not in cells:
        return []
    lines = []
    for r in cells[(cells["status"] == "done") & (cells["not_top_choice_prompts"].fillna(0) > 0)].itertuples():
        lines.append(f"{r.cell_id} ({r.endpoint_server}): in {int(r.not_top_choice_prompts)} of {r.n_prompts} prompts "
                     f"the server chose a token below its own top score at temperature 0 ({r.not_top_choice_steps}): "
                     f"a penalty or bias applied after the scores it reports — a finding about the server, not a "
                     f"divergence.")
    for r in cells[(cells["status"] == "done") & (cells["prompts_counted_otherwise"].fillna(0) > 0)].itertuples():
        lines.append(f"{r.cell_id} ({r.endpoint_server}): the server counted {int(r.prompts_counted_otherwise)} "
                     f"prompt(s) at another length than the ids tokenflip encoded (another tokenizer or template?).")
    return lines
