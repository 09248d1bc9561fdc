"""The report of a large study: render time, memory, size, and how it behaves in a browser.

The study is pipeline_scale.py's: 10 models x 2 benchmarks x (fp32/bf16/fp16 x cache on/off x
batch sizes 1/2/4/8 x interventions none/C-gated) = 960 cells and 1,520 pairs, with the
kv_cache and precision probes on every model x benchmark (30 layers per model). Its
summary tables are synthesised directly, with the columns `tokenflip.analysis.summary` writes and
realistic sizes and values (a few cells missing, about half the prompts diverging, 4
probed prompts x 256 steps per probe), so that the run takes seconds, not the hours of
writing and aggregating 960 cell files. Then:

1. `tokenflip.report.render` in a subprocess: wall time and peak RSS (getrusage).
   Targets: < 60 s, < 2 GB. The HTML file: < 10 MB.
2. In headless Chromium (Debian's `chromium`, driven over the DevTools pipe as in
   tests/report/test_report_browser.py), from file://: console errors and exceptions (target 0),
   requests other than the file itself (target 0), sorting and filtering the 1,520-row
   pairs table (time until the next layout is done; target < 200 ms each), a drill-down
   to one model (`#model=m3`) and a screenshot of the overview at 1400 px width
   (report-overview.png next to the HTML, for a look: labels, figure heights).

  .venv/bin/python perf/report_scale.py [--keep DIR] [--no-browser]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
STEPS, PROMPTS, LAYERS, PROBED = 256, 100, 30, 4


def study(models: int = 10) -> dict[str, Any]:
    """pipeline_scale.py's study (960 cells, 1,520 pairs at 10 models), with both probes."""
    return {
        "run": "scale",
        "models": {f"m{i}": {"source": "random", "architecture": "llama", "seed": i} for i in range(models)},
        "benchmarks": {"arith_a": {"kind": "arithmetic", "n": PROMPTS, "seed": 0, "max_new_tokens": STEPS},
                       "arith_b": {"kind": "arithmetic", "n": PROMPTS, "seed": 1, "max_new_tokens": STEPS}},
        "generation": {"record_top_k": 16, "device": "cpu", "threads": 1},
        "interventions": {"none": {"kind": "none"}, "cgated": {"kind": "fp32_head", "tau": 1e-3, "gated": True}},
        "grids": [{"precision": ["fp32", "bf16", "fp16"], "cache": ["on", "off"], "batch_size": [1, 2, 4, 8],
                   "intervention": ["none", "cgated"]}],
        "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                        {"axis": "precision", "a": "bf16", "b": "fp16"},
                        {"axis": "batch_size", "a": 1, "b": 8},
                        {"axis": "intervention", "a": "none", "b": "cgated"}],
        "probes": {"kv_cache": {"prompts": PROBED}, "precision": {"prompts": PROBED}},
    }


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _divergence_odds(pair, model_index: int) -> float:
    """A plausible divergence probability: fp32 rarely, 16-bit often, worse for larger models."""
    shared = pair.a if pair.axis != "precision" else None
    if shared is not None and shared.precision == "fp32":
        return 0.02
    return min(0.95, 0.35 + 0.05 * model_index + (0.15 if pair.axis == "precision" else 0.0))


def synthetic_frames(models: int = 10, missing_cells: int = 3, seed: int = 0) -> tuple[dict[str, Any],
                                                                                       dict[str, pd.DataFrame]]:
    """(validated config, every summary table) of the synthetic large study."""
    from tokenflip.analysis.causes import CAUSES
    from tokenflip.analysis.compare import summarize
    from tokenflip.analysis.floors import STILL_IDENTICAL_COLUMNS, still_identical_rows
    from tokenflip.analysis.interventions import intervention_rows
    from tokenflip.analysis.summary import _pair_base, environment_rows
    from tokenflip.run.interventions import no_intervention_labels
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import expand_cells, expand_pairs

    rng = np.random.default_rng(seed)
    config = cfg.validate(study(models), source="report_scale")
    cells = expand_cells(config)
    pairs = expand_pairs(config, cells)
    model_index = {m: i for i, m in enumerate(config["models"])}
    gone = {cells[i].id for i in rng.choice(len(cells), size=missing_cells, replace=False)} if missing_cells else set()

    cell_rows, metas = [], {}
    for cell in cells:
        row: dict[str, Any] = {"cell_id": cell.id, **cell.as_dict(), "status": "missing",
                               "no_intervention": cell.intervention in no_intervention_labels(config)}
        if cell.id not in gone:
            tokens = PROMPTS * int(rng.integers(STEPS // 2, STEPS))
            wall = float(rng.uniform(60, 600))
            row.update(status="done", n_prompts=PROMPTS, accuracy=float(rng.uniform(0.3, 0.8)), n_scored=PROMPTS,
                       n_sandbox_errors=0, n_no_answer=int(rng.integers(0, 3)), n_stopped=PROMPTS // 2,
                       generated_tokens=tokens, wall_seconds=wall, compute_seconds=wall,
                       seconds_per_token=wall / tokens, token_stream_sha256=_digest("t", cell.id),
                       logits_sha256=_digest("l", cell.id), device_name="synthetic", device_type="cpu",
                       torch="2.13.0", transformers="5.24.0",
                       trigger_rate=0.02 if cell.intervention != "none" else 0.0,
                       mean_margin=float(rng.uniform(2, 6)), cv_margin=float(rng.uniform(0.8, 2.0)))
            metas[cell.id] = {"environment": {"software": {"torch": "2.13.0", "transformers": "5.24.0"},
                                              "device": {"type": "cpu", "name": "synthetic", "threads": 1},
                                              "determinism": {"deterministic_algorithms": False}},
                              "model": {"architecture": "llama", "num_parameters": 1_000_000,
                                        "spec": config["models"][cell.model],
                                        "weights_sha256": _digest("w", cell.model),
                                        "tokenizer_sha256": _digest("k", cell.model)},
                              "benchmark": {"name": cell.benchmark, "n": PROMPTS, "prompt_format": "bare",
                                            "scorer": "exact"}}
        cell_rows.append(row)
    cells_df = pd.DataFrame(cell_rows)

    pair_rows, first_div, agreement, per_prompt_frames = [], [], {}, {}
    prompt_ids = [f"arith-{p:04d}" for p in range(PROMPTS)]
    for pair in pairs:
        row = _pair_base(pair, no_intervention_labels(config))
        if pair.a.id in metas and pair.b.id in metas:
            odds = _divergence_odds(pair, model_index[pair.a.model])
            identical = rng.random(PROMPTS) >= odds
            first = np.where(identical, np.nan, rng.gamma(2.0, 20.0, PROMPTS).clip(0, STEPS - 1).round())
            margin = np.where(identical, np.nan, rng.exponential(0.05, PROMPTS))
            correct_a, correct_b = rng.random(PROMPTS) < 0.6, rng.random(PROMPTS) < 0.6
            n_tokens = rng.integers(STEPS // 2, STEPS, PROMPTS)
            per_prompt = pa.table({
                "prompt_id": prompt_ids, "identical": identical, "first_div_step": first,
                "correct_a": correct_a, "correct_b": np.where(identical, correct_a, correct_b),
                "logit_diff_before_div": rng.random(PROMPTS) < 0.9, "steps_logit_diff": rng.integers(0, 50, PROMPTS),
                "steps_compared": n_tokens, "max_abs_dlogit_before_div": rng.exponential(0.05, PROMPTS),
                "same_answer": identical | (rng.random(PROMPTS) < 0.7), "margin_a_at_div": margin,
                "margin_b_at_div": margin, "mean_margin_a": rng.uniform(2, 6, PROMPTS),
                "rms_dlogit_before_div": rng.exponential(0.02, PROMPTS), "near_ties_a": rng.integers(0, 5, PROMPTS),
                "n_tokens_a": n_tokens, "n_tokens_b": np.where(identical, n_tokens, rng.integers(STEPS // 2, STEPS,
                                                                                                  PROMPTS)),
                "cause": np.where(identical, None, np.array(CAUSES[:4])[rng.integers(0, 4, PROMPTS)]),
                "rejoin_step": np.where(identical | (rng.random(PROMPTS) < 0.7), np.nan, first + 5)})
            per_prompt_frames[pair.id] = per_prompt.to_pandas()
            row.update(status="done", **summarize(per_prompt), machine_a="synthetic", machine_b="synthetic")
            agreement[pair.id] = pd.DataFrame({"agree": identical}, index=pd.Index(prompt_ids, name="prompt_id"))
            for p in np.flatnonzero(~identical):
                first_div.append({"pair_id": pair.id, "label": pair.label, "axis": pair.axis,
                                  "context": pair.context, "model": pair.a.model, "benchmark": pair.a.benchmark,
                                  "prompt_id": prompt_ids[p], "first_div_step": float(first[p]),
                                  "margin_a_at_div": float(margin[p]), "margin_b_at_div": float(margin[p]),
                                  "cause": per_prompt["cause"][p].as_py(),
                                  "rejoin_step": per_prompt["rejoin_step"][p].as_py(),
                                  "same_answer": bool(per_prompt["same_answer"][p].as_py())})
        pair_rows.append(row)

    frames: dict[str, pd.DataFrame] = {
        "cells": cells_df, "pairs": pd.DataFrame(pair_rows),
        "first_divergence": pd.DataFrame(first_div),
        "still_identical": pd.DataFrame(still_identical_rows(pairs, per_prompt_frames), columns=STILL_IDENTICAL_COLUMNS),
        "interventions": pd.DataFrame(intervention_rows(config, agreement, cells_df)),
        "environment": pd.DataFrame(environment_rows(metas), columns=["kind", "name", "json"]),
    }
    frames.update(_probe_frames(config, rng))
    return config, frames


def _probe_frames(config: dict[str, Any], rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    """The probe tables at their real shapes: per model x benchmark, PROBED prompts x STEPS
    steps, LAYERS layers (layer tables already averaged over prompts, as the summary does)."""
    kv_steps, kv_layers, kv_patch, pr_steps, pr_layers, grafting, lens = ([] for _ in range(7))
    steps = np.arange(STEPS)
    layer_idx = np.arange(LAYERS)
    for mi, model in enumerate(config["models"]):
        for bench in config["benchmarks"]:
            key = {"model": model, "benchmark": bench}
            for precision, scale in (("fp32", 1e-7), ("fp16", 1e-3)):
                for p in range(PROBED):
                    kl = rng.lognormal(np.log(scale), 1.5, STEPS)
                    margin = rng.exponential(1.5, STEPS)
                    flip = margin < (0.02 if precision == "fp16" else 0.0)
                    kv_steps.append(pd.DataFrame({**key, "precision": precision, "prompt_id": f"arith-{p:04d}",
                                                  "step": steps, "kl": kl, "flip": flip, "margin_on": margin,
                                                  "margin_off": margin + rng.normal(0, scale, STEPS),
                                                  "max_abs_dlogit": rng.exponential(scale * 30, STEPS),
                                                  "top1_on": rng.integers(0, 49152, STEPS),
                                                  "top1_off": rng.integers(0, 49152, STEPS)}))
                    for t in range(3):
                        patches = [("none", "none", -1, 1.0), ("residual stream", "residual stream", -1, 0.9),
                                   ("kv cache", "kv cache", -1, 0.0)]
                        patches += [(f"{kind} {layer}", kind, layer, float(rng.random()))
                                    for kind in ("residual layer", "kv layer") for layer in range(LAYERS)]
                        for patch, kind, layer, factor in patches:
                            kv_patch.append({**key, "precision": precision, "prompt_id": f"arith-{p:04d}",
                                             "step": 10 * t, "patch": patch, "kind": kind, "layer": layer,
                                             "kl": float(kl[t] * factor), "kl_recovered": 1.0 - factor,
                                             "flip": False, "max_abs_dlogit": scale * 30 * factor})
                growth = scale * (1 + layer_idx * (0.1 + 0.02 * mi))
                l2 = np.outer(np.ones(STEPS), growth) * rng.lognormal(0, 0.3, (STEPS, LAYERS))
                kv_layers.append(pd.DataFrame({**key, "precision": precision, "layer": np.tile(layer_idx, STEPS),
                                               "step": np.repeat(steps, LAYERS), "l2": l2.ravel(),
                                               "rel_l2": (l2 / 50).ravel()}))
            pair = {"a": "bf16", "b": "fp16"}
            for p in range(PROBED):
                margin = rng.exponential(1.5, STEPS)
                sigma_head, sigma_body = rng.lognormal(np.log(0.02), 0.3, STEPS), rng.lognormal(np.log(0.004), 0.3, STEPS)
                flip = margin < 0.03
                pr_steps.append(pd.DataFrame({**key, **pair, "prompt_id": f"arith-{p:04d}", "step": steps,
                                              "kl": rng.lognormal(np.log(1e-3), 1.5, STEPS), "flip": flip,
                                              "margin_a": margin, "margin_b": margin + rng.normal(0, 0.02, STEPS),
                                              "sigma_z": np.hypot(sigma_head, sigma_body), "sigma_z_head": sigma_head,
                                              "sigma_z_body": sigma_body, "max_abs_dlogit": 30 * sigma_head,
                                              "directional": rng.normal(0, 0.03, STEPS)}))
                diverged = bool(flip.any())
                traced = int(np.argmax(flip)) if diverged else 0
                for layer in range(LAYERS):
                    lens.append({**key, **pair, "prompt_id": f"arith-{p:04d}", "step": traced,
                                 "group": "diverged" if diverged else "agreed", "layer": layer,
                                 "top1_agree": bool(rng.random() < 0.5 + 0.5 * layer / LAYERS),
                                 "top2_agree": bool(rng.random() < 0.8 + 0.2 * layer / LAYERS),
                                 "margin_a": float(rng.exponential(0.3 if diverged else 3.0)),
                                 "margin_b": float(rng.exponential(0.3 if diverged else 3.0)),
                                 "l2": float(0.05 * (1 + 0.2 * layer))})
                for t in np.nonzero(flip)[0][:3]:
                    fixed_from = int(rng.integers(LAYERS // 2, LAYERS))
                    for direction in ("b→a", "a→b"):
                        sites = [("embedding", "embedding", -1, False)]
                        sites += [(f"layer {layer}", "layer", layer, layer >= fixed_from) for layer in range(LAYERS)]
                        sites += [("final norm", "final_norm", -1, True), ("kv cache", "kv_cache", -1,
                                                                           bool(rng.random() < 0.5))]
                        for graft, site, layer, fixed in sites:
                            grafting.append({**key, **pair, "prompt_id": f"arith-{p:04d}", "step": int(t),
                                             "direction": direction, "graft": graft, "site": site, "layer": layer,
                                             "fixed": fixed})
            growth = 0.05 * (1 + layer_idx * 0.2)
            l2 = np.outer(np.ones(STEPS), growth) * rng.lognormal(0, 0.3, (STEPS, LAYERS))
            pr_layers.append(pd.DataFrame({**key, **pair, "layer": np.tile(layer_idx, STEPS),
                                           "step": np.repeat(steps, LAYERS), "l2": l2.ravel()}))
    return {"kv_steps": pd.concat(kv_steps, ignore_index=True), "kv_layers": pd.concat(kv_layers, ignore_index=True),
            "kv_patching": pd.DataFrame(kv_patch), "precision_steps": pd.concat(pr_steps, ignore_index=True),
            "precision_layers": pd.concat(pr_layers, ignore_index=True), "precision_grafting": pd.DataFrame(grafting),
            "precision_lens": pd.DataFrame(lens)}


def write_synthetic_summaries(out_dir: str | Path, models: int = 10, missing_cells: int = 3) -> dict[str, Any]:
    """Write the synthetic study's summary tables into `out_dir`; returns its config."""
    from tokenflip.core import storage

    config, frames = synthetic_frames(models, missing_cells)
    out_dir = Path(out_dir)
    for name, df in frames.items():
        storage.write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir / f"{name}.parquet",
                            {"kind": "summary", "table": name, "run": config["run"]})
    return config


RENDER = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[4])
t0 = time.perf_counter()
from tokenflip.report import render
imported = time.perf_counter() - t0
t0 = time.perf_counter()
render(sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])))
print(json.dumps({"seconds": time.perf_counter() - t0, "import_seconds": imported,
                  "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def render_in_subprocess(summary_dir: Path, out: Path, config_json: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", RENDER, str(summary_dir), str(out), str(config_json),
                           str(REPO / "src")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"render failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Sort the pairs table by its divergence-rate column, then filter it; each measured until
# the layout after the change is done (offsetHeight forces it). Returns milliseconds.
INTERACTION_PROBE = """(() => {
  const table = document.getElementById("pairs-table");
  const header = [...table.tHead.rows[0].cells].find(th => th.textContent.trim() === "divergence rate");
  const input = table.closest("section").querySelector("input.table-filter");
  const count = table.closest("section").querySelector(".table-tools span");
  const rows = () => `${table.tBodies[0].rows.length} shown; ${count.textContent}`;
  const time = fn => { const t0 = performance.now(); fn(); document.body.offsetHeight; return performance.now() - t0; };
  const out = {rows: Number(table.dataset.rows)};
  out.sortMs = [];
  out.sortShown = [];
  for (let i = 0; i < 5; i++) {
    out.sortMs.push(time(() => header.click()));
    out.sortShown.push(table.tBodies[0].rows.length);
  }
  out.filterMs = time(() => { input.value = "m3"; input.dispatchEvent(new Event("input")); });
  out.filteredRows = rows();
  out.clearMs = time(() => { input.value = ""; input.dispatchEvent(new Event("input")); });
  out.clearedRows = rows();
  return out;
})()"""


# The drill-down to one model, as a click on its link: pair rows shown, and whether each is
# that model's (after the hashchange has been handled).
DRILL_PROBE = """new Promise(done => {
  window.addEventListener("hashchange", () => setTimeout(() => {
    document.querySelector("#pairs .show-all").click();
    const shown = [...document.querySelectorAll("#pairs-table tbody tr")];
    done({shown: shown.length, all_m3: shown.every(r => r.cells[0].textContent.trim() === "m3"),
          status: document.getElementById("drill-status").textContent});
  }, 0), {once: true});
  document.querySelector('#overview a[href="#model=m3"]').click();
})"""


def browser_checks(report: Path, shot: Path, width: int = 1400) -> dict[str, Any]:
    """Load the report in headless Chromium: errors, requests, interaction times, drill-down,
    and a screenshot of the overview."""
    # the report test's helpers, and the ones they import from the workflow test and conftest
    sys.path[:0] = [str(REPO / "tests" / "report"), str(REPO / "tests" / "system"), str(REPO / "tests")]
    from test_report_browser import DevTools, find_chromium, open_page, page_problems

    profile = Path(tempfile.mkdtemp(prefix="report-scale-chromium-"))
    tools = DevTools(find_chromium(), profile)
    try:
        session, events, loaded = open_page(tools, report, (width, 900))
        interaction = tools.send("Runtime.evaluate", {"expression": INTERACTION_PROBE, "returnByValue": True},
                                 session=session)["result"]["value"]
        drill = tools.send("Runtime.evaluate", {"expression": DRILL_PROBE, "returnByValue": True,
                                                "awaitPromise": True}, session=session)["result"]["value"]
        tools.send("Runtime.evaluate", {"expression": "location.hash = '#all'; scrollTo(0, 0)"}, session=session)
        box = tools.send("Runtime.evaluate", {"expression": "(() => { const r = document.getElementById('overview')"
                                              ".getBoundingClientRect(); return [r.top + scrollY, r.height,"
                                              " [...document.querySelectorAll('#overview figure')].map("
                                              "f => f.getBoundingClientRect().height)]; })()",
                                              "returnByValue": True}, session=session)["result"]["value"]
        top, height, figure_heights = box
        shot_data = tools.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": top + height, "scale": 1}},
            session=session, timeout=60)["data"]
        shot.write_bytes(base64.b64decode(shot_data))
        events = [e for e in tools.events[events:] if e.get("sessionId") == session]
    finally:
        tools.close()
        shutil.rmtree(profile, ignore_errors=True)
    problems = page_problems(events, report.resolve().as_uri())
    return {"load_seconds": loaded, "errors": problems["console"] + problems["exceptions"] + problems["log"],
            "foreign_requests": problems["requests"],
            "interaction": interaction, "drilldown_rows": drill, "figure_heights": figure_heights,
            "overview_height": height}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    p.add_argument("--no-browser", action="store_true", help="skip the Chromium checks")
    p.add_argument("--models", type=int, default=10, help="models in the study (10: 960 cells, 1,520 pairs)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    root = args.keep or Path(tempfile.mkdtemp(prefix="tokenflip-report-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    try:
        t0 = time.perf_counter()
        config = write_synthetic_summaries(root / "summary", args.models)
        made = time.perf_counter() - t0
        sizes = {f.stem: pa.parquet.read_metadata(f).num_rows for f in sorted((root / "summary").glob("*.parquet"))}
        print(f"synthetic summaries in {made:.1f} s: " + ", ".join(f"{k} {v:,}" for k, v in sizes.items()))
        (root / "config.json").write_text(json.dumps(config))
        report = root / "report" / "index.html"
        r = render_in_subprocess(root / "summary", report, root / "config.json")
        size = report.stat().st_size
        print(f"render: {r['seconds']:.1f} s (imports {r['import_seconds']:.1f} s more), peak RSS "
              f"{r['maxrss_bytes'] / 2**30:.2f} GiB   targets < 60 s: {_ok(r['seconds'] < 60)}, < 2 GB: "
              f"{_ok(r['maxrss_bytes'] < 2e9)}")
        print(f"HTML: {size / 2**20:.2f} MiB   target < 10 MB: {_ok(size < 10e6)}")
        summary = (f"summary: render {r['seconds']:.1f} s, {r['maxrss_bytes'] / 2**30:.2f} GiB, HTML "
                   f"{size / 2**20:.2f} MiB")
        if not args.no_browser:
            b = browser_checks(report, report.parent / "report-overview.png")
            i = b["interaction"]
            print(f"Chromium: loaded in {b['load_seconds']:.1f} s; console errors/exceptions: {len(b['errors'])} "
                  f"{_ok(not b['errors'])}; requests other than the file: {len(b['foreign_requests'])} "
                  f"{_ok(not b['foreign_requests'])}")
            for e in b["errors"][:5]:
                print("   ", json.dumps(e)[:300])
            print(f"pairs table ({i['rows']} rows): sort (5 clicks) {', '.join(f'{t:.0f}' for t in i['sortMs'])} ms, "
                  f"filter 'm3' {i['filterMs']:.0f} ms ({i['filteredRows']}), clear {i['clearMs']:.0f} ms "
                  f"({i['clearedRows']})   target < 200 ms: "
                  f"{_ok(max(*i['sortMs'], i['filterMs'], i['clearMs']) < 200)}")
            d = b["drilldown_rows"]
            print(f"drill-down (click on m3 in the overview): {d['shown']} pair rows shown, all of m3: {d['all_m3']}; "
                  f"'{d['status']}'")
            print(f"overview at 1400 px: {b['overview_height']:.0f} px tall, figures "
                  f"{', '.join(f'{h:.0f}' for h in b['figure_heights'])} px (two screens: 1800 px): "
                  f"{_ok(max(b['figure_heights'], default=0) < 1800)}; screenshot "
                  f"{report.parent / 'report-overview.png'}")
            summary += (f", sort {max(i['sortMs']):.0f} ms, filter {i['filterMs']:.0f} ms, "
                        f"{len(b['errors'])} errors, {len(b['foreign_requests'])} foreign requests")
        print(summary)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


def _ok(passed: bool) -> str:
    return "ok" if passed else "MISSED"


if __name__ == "__main__":
    raise SystemExit(main())
