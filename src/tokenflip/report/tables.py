"""The report's tables and claims: rows for the template, from the summaries."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from tokenflip.report.common import PATCH_FIGURES, WHOLE_PATCHES, _pooled, condition_labels, graft_frame


def kv_table(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """Cache ON vs OFF per model × benchmark × engine × decoding × precision × batch size
    (paper Table: divergence, accuracy ON vs OFF, McNemar)."""
    if pairs.empty:
        return []
    cache = pairs[(pairs["axis"] == "cache") & (pairs["status"] == "done")].copy()
    if cache.empty:
        return []
    cache = cache.assign(accuracy_diff=cache["accuracy_a"] - cache["accuracy_b"])
    keys = ["model", "benchmark", *(["engine"] if "engine" in cache else []), "decoding", "precision", "batch_size"]
    return cache.sort_values(keys).to_dict("records")


def kv_claims(rows: list[dict[str, Any]], probe_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The paper's headline claims next to what this run measured, each by the paper's
    quantity: the FP32 falsification's "eight orders of magnitude" (Fig. 3) is a ratio of
    per-step KL, which only the teacher-forced KV-cache probe measures (`probe_rows`, see
    `probe_claims`), never a ratio of max |Δlogit|."""
    if not rows:
        return {}
    df = pd.DataFrame(rows)
    # "Cache-ON more accurate in 8 of 9 conditions" (arXiv 2604.15409, abstract and §4) counts
    # the FP16 conditions (model x decoding strategy) only: the FP32 rows are the control.
    fp16 = df[df["precision"] == "fp16"]
    out: dict[str, Any] = {"conditions": len(fp16),
                           "on_better": int((fp16["accuracy_diff"] > 0).sum()),
                           "off_better": int((fp16["accuracy_diff"] < 0).sum())}
    # One bullet per model, engine and precision: a llama.cpp row and a transformers row of the
    # same precision (or a real and a random model) are different findings, never pooled.
    df = df.assign(model=df.get("model", ""), engine=df.get("engine", "transformers"))
    out["groups"] = []
    for (model, engine, precision), sub in df.groupby(["model", "engine", "precision"], sort=True, dropna=False):
        out["groups"].append({"model": model, "engine": engine, "precision": precision,
                              "diverged": int(sub["n_diverged"].sum()), "n": int(sub["n_prompts"].sum()),
                              "nonequiv": int(sub["n_logit_diff_before_div"].sum()),
                              "max_dlogit": float(sub["max_abs_dlogit"].max())})
    ratios = [r for r in probe_rows or [] if r["precision"] == "fp16" and r.get("kl_vs_fp32") is not None]
    out["fp32_kl"] = [{"model": r["model"], "log10": math.log10(r["kl_vs_fp32"])} for r in ratios]
    return out


_WHY = {"diverged": "diverged in the pair it explains", "agreed": "agreed there", "first": "the benchmark's first"}


def traced_prompts(steps: pd.DataFrame) -> list[dict[str, str]]:
    """Per model × benchmark, which prompts a probe traced and why (its `chosen_as`: from
    the results of the pairs it explains, or the benchmark's first)."""
    if steps.empty or "chosen_as" not in steps:
        return []
    out = []
    chosen = steps.drop_duplicates(["model", "benchmark", "prompt_id"])
    for (model, bench), g in chosen.groupby(["model", "benchmark"], sort=True):
        parts = [f"{', '.join(map(str, h['prompt_id']))} ({_WHY.get(why, why)})"
                 for why, h in g.groupby("chosen_as", sort=False)]
        out.append({"model": model, "benchmark": bench, "text": "traced " + "; ".join(parts)})
    return out


def flip_table(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per probed prompt: the first step where cache-off would pick another token, with the
    KL and margin there and the largest KL before it (paper Fig. 4's data)."""
    if steps.empty:
        return []
    rows = []
    for (model, precision, prompt), g in steps.sort_values("step").groupby(["model", "precision", "prompt_id"]):
        flips = g[g["flip"]]
        first = flips.iloc[0] if len(flips) else None
        before = g[g["step"] < first["step"]] if first is not None else g
        rows.append({"model": model, "precision": precision, "prompt_id": prompt,
                     "first_flip": int(first["step"]) if first is not None else None,
                     "kl_at_flip": float(first["kl"]) if first is not None else None,
                     "margin_at_flip": float(first["margin_on"]) if first is not None else None,
                     "max_kl_before": float(before["kl"].max()) if len(before) else None,
                     "min_margin_before": float(before["margin_on"].min()) if len(before) else None})
    return rows


def probe_claims(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per precision, from the teacher-forced KV probe: how far cache-off moves the logits
    at identical inputs, and on how many steps it would pick another token."""
    if steps.empty:
        return []
    rows = []
    for (model, precision), g in steps.groupby(["model", "precision"]):
        rows.append({"model": model, "precision": precision, "steps": len(g), "flips": int(g["flip"].sum()),
                     "steps_differ": int((g["max_abs_dlogit"] > 0).sum()),
                     "median_kl": float(g["kl"].median()), "max_kl": float(g["kl"].max()),
                     "max_abs_dlogit": float(g["max_abs_dlogit"].max())})
    # "Eight orders of magnitude" (arXiv 2604.15409, Fig. 3) is a ratio of KL, which grows with
    # the square of the logit difference: compare KL with KL (median over the probed steps).
    by = {(r["model"], r["precision"]): r for r in rows}
    for r in rows:
        fp32 = by.get((r["model"], "fp32"))
        r["kl_vs_fp32"] = (r["median_kl"] / fp32["median_kl"]
                           if fp32 and fp32["median_kl"] > 0 and r["precision"] != "fp32" else None)
        r["dlogit_vs_fp32"] = (r["max_abs_dlogit"] / fp32["max_abs_dlogit"]
                               if fp32 and fp32["max_abs_dlogit"] > 0 and r["precision"] != "fp32" else None)
    return rows


def form_claims(forms: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cache form, from the KV probe: how far the form moves the logits of the default
    cache at identical inputs, and on how many steps it would pick another token."""
    if forms.empty:
        return []
    return [{"model": model, "precision": precision, "form": form, "prompts": int(g["prompt_id"].nunique()),
             "steps": len(g), "flips": int(g["flip"].sum()), "steps_differ": int((g["max_abs_dlogit"] > 0).sum()),
             "median_kl": float(g["kl"].median()), "max_kl": float(g["kl"].max()),
             "max_abs_dlogit": float(g["max_abs_dlogit"].max())}
            for (model, precision, form), g in forms.groupby(["model", "precision", "form"])]


def patching_table(patching: pd.DataFrame) -> list[dict[str, Any]]:
    """Unpatched, the whole residual stream and the whole KV cache, per model and
    precision (the per-layer patches: `patching_layer_table`)."""
    if patching.empty or "kind" not in patching:
        return []
    data = patching[patching["kind"].isin(("none", *WHOLE_PATCHES))]
    agg = data.groupby(["model", "precision", "patch"], as_index=False).agg(
        **PATCH_FIGURES, max_abs_dlogit=("max_abs_dlogit", "max"))
    order = {patch: i for i, patch in enumerate(("none", *WHOLE_PATCHES))}
    return agg.sort_values(["model", "precision", "patch"], key=lambda c: c.map(order) if c.name == "patch" else c
                           ).to_dict("records")


def patching_layer_table(patching: pd.DataFrame) -> list[dict[str, Any]]:
    """The per-layer patches, one row per model, precision, kind and layer."""
    if patching.empty or "kind" not in patching:
        return []
    data = patching[patching["kind"].isin(("residual layer", "kv layer"))]
    return data.groupby(["model", "precision", "kind", "layer"], as_index=False).agg(**PATCH_FIGURES).to_dict("records")


def probe_sigma_z(steps: pd.DataFrame) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """σz as arXiv 2609.26621 §I.3 defines it (per-logit RMS of the logit difference over
    the whole vocabulary), pooled over the precision probe's steps as an RMS, and the LM
    head's share of it (§7.3: 97.6%), Σσ_head² / Σ(σ_head² + σ_body²), per model,
    benchmark and precision pair."""
    if steps.empty or "sigma_z" not in steps:
        return {}
    keys = ["model", "benchmark", "a", "b"]
    sq = steps.assign(total=steps["sigma_z"] ** 2, head=steps.get("sigma_z_head", float("nan")) ** 2,
                      body=steps.get("sigma_z_body", float("nan")) ** 2).groupby(keys)[["total", "head", "body"]]
    mean, summed = sq.mean(), sq.sum()
    share = summed["head"] / (summed["head"] + summed["body"])
    return {key: {"sigma_z": float(mean.loc[key, "total"] ** 0.5), "head_share": float(share.loc[key])}
            for key in mean.index}


def precision_table(pairs: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """Cross-precision divergence spectrum (paper Table 2): precision pairs, no intervention,
    with σz from the precision probe where it ran on the same model, benchmark and pair."""
    if pairs.empty:
        return []
    prec = pairs[(pairs["axis"] == "precision") & (pairs["status"] == "done")].copy()
    if prec.empty:
        return []
    prec = prec.assign(ear_low=1 - prec["divergence_ci_high"], ear_high=1 - prec["divergence_ci_low"])
    prec = prec[prec["no_intervention"].astype(bool)]
    sigma = probe_sigma_z(steps if steps is not None else pd.DataFrame())
    nothing = {"sigma_z": float("nan"), "head_share": float("nan")}
    for column in nothing:
        prec[column] = [sigma.get((r.model, r.benchmark, r.a, r.b), nothing)[column] for r in prec.itertuples()]
    return prec.sort_values(["model", "benchmark", "a", "b", "cache", "batch_size"]).to_dict("records")


def grafting_table(grafting: pd.DataFrame) -> list[dict[str, Any]]:
    """Flips fixed by grafting one site (or the KV cache) of the other precision, in both
    directions (paper Table 8, App. II(iii))."""
    if grafting.empty or "direction" not in grafting:
        return []
    frame = graft_frame(grafting)
    if "lossless" not in frame:
        frame = frame.assign(lossless=float("nan"))
    agg = frame.groupby(["model", "into", "graft", "position"], as_index=False).agg(
        flips=("fixed", "size"), fixed=("fixed", "sum"), lossless=("lossless", "mean"))
    return agg.assign(rate=agg["fixed"] / agg["flips"]).sort_values(["model", "into", "position"]).to_dict("records")


def lens_table(lens: pd.DataFrame) -> list[dict[str, Any]]:
    """Logit lens per layer for Diverged and Agreed prompts (paper Table 10, App. III):
    top-1 and top-2 agreement, median top-2 margins of both precisions, mean layer L2."""
    if lens.empty or "group" not in lens:
        return []
    agg = lens.groupby(["model", "a", "b", "group", "layer"], as_index=False).agg(
        prompts=("top1_agree", "size"), top1=("top1_agree", "mean"), top2=("top2_agree", "mean"),
        margin_a=("margin_a", "median"), margin_b=("margin_b", "median"), l2=("l2", "mean"))
    return agg.sort_values(["model", "a", "b", "group", "layer"]).to_dict("records")


def cv_heuristic(cells: pd.DataFrame, interventions: pd.DataFrame) -> list[dict[str, Any]]:
    """CV of the top-2 margin in one 16-bit run (no intervention, batch size 1) against the
    lift each intervention measured, per model × benchmark; Spearman across those points.
    In-sample: the same prompts give both numbers."""
    from scipy.stats import pearsonr, spearmanr

    if cells.empty or interventions.empty or "cv_margin" not in cells:
        return []
    done = interventions[(interventions["status"] == "done") & ~interventions["baseline"].astype(bool)
                         & (interventions["batch_size"] == 1)]
    base = cells[(cells["status"] == "done") & cells["no_intervention"].astype(bool) & (cells["batch_size"] == 1)]
    out = []
    for name, group in done.groupby("intervention"):
        points = []
        for r in group.itertuples():
            cv = base[(base["model"] == r.model) & (base["benchmark"] == r.benchmark) & (base["precision"] == r.a)
                      & (base["cache"] == r.cache)]["cv_margin"]
            if len(cv):
                points.append((float(cv.iloc[0]), float(r.lift)))
        rho = p = r_pearson = p_pearson = float("nan")
        if len(points) >= 3:
            res = spearmanr([x for x, _ in points], [y for _, y in points])
            rho, p = float(res.statistic), float(res.pvalue)
            pres = pearsonr([x for x, _ in points], [y for _, y in points])   # the paper gives both (§8.3)
            r_pearson, p_pearson = float(pres.statistic), float(pres.pvalue)
        out.append({"intervention": name, "points": len(points), "rho": rho, "p": p, "pearson_r": r_pearson,
                    "pearson_p": p_pearson})
    return out


def drilldown_table(pairs: pd.DataFrame, first_div: pd.DataFrame) -> list[dict[str, Any]]:
    """Per model x benchmark x condition: pooled divergence with its interval, median first
    divergence step and accuracy of both sides; the table the drill-down filters."""
    done = pairs[pairs["status"] == "done"] if not pairs.empty else pairs
    if done.empty:
        return []
    done = done.assign(condition=condition_labels(done))
    keys = ["model", "benchmark", "condition"]
    table = done.groupby(keys, sort=False).apply(_pooled, include_groups=False).reset_index()
    extra = done.groupby(keys, sort=False).agg(pairs=("pair_id", "size"), accuracy_a=("accuracy_a", "mean"),
                                              accuracy_b=("accuracy_b", "mean"),
                                              max_abs_dlogit=("max_abs_dlogit", "max")).reset_index()
    table = table.merge(extra, on=keys)
    if not first_div.empty:
        steps = first_div.merge(done[["pair_id", "condition"]], on="pair_id").groupby(keys)["first_div_step"].median()
        table = table.merge(steps.rename("median_first_div_step").reset_index(), on=keys, how="left")
    else:
        table = table.assign(median_first_div_step=float("nan"))
    return table.sort_values(keys).to_dict("records")


def measured_accuracy(pairs: pd.DataFrame, unmeasured: dict[str, str]) -> pd.DataFrame:
    """The pairs with no accuracy (and no McNemar test) on a side whose cell's accuracy is not
    measured (`page._unmeasured`), for every table and figure alike; what its scored rest got stays
    in `accuracy_a_of_rest` / `accuracy_b_of_rest` for the pairs table's hover."""
    if pairs.empty or "accuracy_a" not in pairs:
        return pairs
    out = pairs.copy()
    either = pd.Series(False, index=out.index)
    for side in ("a", "b"):
        cut = out[f"cell_{side}"].isin(list(unmeasured))
        out[f"accuracy_{side}_of_rest"] = out[f"accuracy_{side}"]
        out[f"accuracy_{side}"] = out[f"accuracy_{side}"].where(~cut)
        either |= cut
    out["mcnemar_p"] = out["mcnemar_p"].where(~either)
    return out
