"""Every papers row, as data: the claim, the paper's figure and section, the population
(summary table, axis values, the paper's models and benchmarks) and the statistic."""

from __future__ import annotations

from tokenflip.report.paper.formats import ANY, _both, _num, _pct, _power, _pp
from tokenflip.report.paper.statistics import (
    _body_agreement,
    _body_projection,
    _body_rule,
    _cost_per_trigger,
    _ear,
    _final_margins,
    _first_layer_share,
    _first_token,
    _graft,
    _head_share,
    _kl_ratio,
    _lift,
    _margin_trend,
    _matched_pairs,
    _on_better,
    _overhead,
    _pairs_detail,
    _patching,
    _prompt_length,
    _rate,
    _rms_rule,
    _rms_sigma,
    _share_from,
    _traced_detail,
)
from tokenflip.report.paper.study import KV, KV_MODELS, PRECISION, Row, _last_layer

_TINY = ("TinyLlama",)


_TINY_QWEN = ("TinyLlama", "Qwen2.5-3B")


_BF16_FP16 = {"axis": "precision", "between": ("bf16", "fp16")}


_CODE_MATH = ("gsm8k", "humaneval", "mbpp")


ROWS: tuple[Row, ...] = (
    # arXiv 2604.15409: LLaMA-2-7B, Mistral-7B-v0.3, Gemma-2-2B on GSM8K (abstract, §4).
    Row(KV, "token divergence, cache ON vs OFF, FP16", "100%",
        "every condition: 3 base models × 3 decoding strategies, GSM8K (abstract, §4)", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=("model", "decoding"), show="range", detail=_pairs_detail),
    Row(KV, "token divergence, cache ON vs OFF, FP32", "0%", "3 models, GSM8K, the falsification control (§4)",
        "pairs", _rate, select={"axis": "cache", "between": ("on", "off"), "precision": "fp32", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), show="range", detail=_pairs_detail),
    # Not the paper's engine: its FP16 condition and FP32 control run in llama.cpp on the model's
    # GGUF (KV cache F16, llama.cpp's default, or F32), beside the paper's PyTorch figures.
    Row(KV, "token divergence, cache ON vs OFF, FP16, in llama.cpp", "100% (PyTorch)",
        "the paper's FP16 condition (§4); here the model's GGUF in llama.cpp, F16 KV cache", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "engine": "llama.cpp",
                "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=("model", "decoding"), show="range", detail=_pairs_detail),
    Row(KV, "token divergence, cache ON vs OFF, FP32, in llama.cpp", "0% (PyTorch)",
        "the falsification control (§4); here in llama.cpp, F32 KV cache", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp32", "engine": "llama.cpp",
                "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), show="range", detail=_pairs_detail),
    Row(KV, "cache ON more accurate", "8 of 9", "FP16 conditions: 3 models × 3 decoding strategies (abstract)",
        "pairs", _on_better, fmt=str,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=(), detail=_pairs_detail),
    Row(KV, "FP32 shrinks the drift: median per-step KL, FP16 / FP32", "≈ 10^8", "3 models, Fig. 3",
        "kv_steps", _kl_ratio, fmt=_power, models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"KV-cache probe, {r['prompt_id'].nunique()} prompt(s), {len(r)} step(s)"),
    Row(KV, "KL recovered: residual stream vs KV cache patch", "residual stream fails; KV cache recovers",
        "3 models, FP16, Fig. 5", "kv_patching", _patching, fmt=_both(_pct), select={"precision": "fp16"},
        models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"median KL recovered, {int((r['kind'] == 'none').sum())} patched step(s)"),
    Row(KV, "layer drift: the first layer's share of the last layer's", "GQA (LLaMA-2, Mistral): sharp at the "
        "first layer; Gemma-2: uniform", "3 models, FP16, Fig. 2", "kv_layers", _first_layer_share, fmt=_num,
        select={"precision": "fp16"}, models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"median over steps of L2(first layer) / L2(last layer), {r['step'].nunique()} step(s)"),

    # arXiv 2609.26621. §2: pass@1 and divergence under bare prompts.
    Row(PRECISION, "prompts whose greedy output differs, BF16 vs FP16", "49–100%",
        "6 models 1.1–7B × GSM8K, HumanEval, MBPP, A10G (abstract, §9)", "pairs", _rate, select=_BF16_FP16,
        benchmarks=_CODE_MATH, bare=True, by=("model", "benchmark"), show="range", detail=_pairs_detail),
    Row(PRECISION, "TinyLlama's divergence over the three benchmarks", "59–70%", "TinyLlama, §1, Table 2", "pairs",
        _rate, select=_BF16_FP16, models=_TINY, benchmarks=_CODE_MATH, bare=True, by=("model", "benchmark"),
        show="range", detail=_pairs_detail),
    Row(PRECISION, "median first divergence step", "34–50 tokens", "non-Qwen models, §6.2", "first_divergence",
        lambda r: float(r["first_div_step"].median()), fmt=_num, select=_BF16_FP16, exclude=("qwen",),
        benchmarks=_CODE_MATH, bare=True, show="range",
        detail=lambda r: f"median per model, {len(r)} diverged prompt(s)"),
    Row(PRECISION, "prompts diverging at the first token", "all", "Qwen2.5-7B-Instruct, §6.2", "first_divergence",
        _share_from(lambda s: s == 0), select=_BF16_FP16, models=("Qwen2.5-7B",), benchmarks=_CODE_MATH,
        bare=True),
    Row(PRECISION, "prompts diverging within the first 9 tokens", "86% (median step 6)",
        "DS-R1-Distill-Qwen-7B, App. V, Table 14", "first_divergence", _share_from(lambda s: s < 9),
        select=_BF16_FP16, models=("DS-R1-Qwen-7B",), benchmarks=_CODE_MATH, bare=True),
    Row(PRECISION, "within-precision repeat: exact agreement", "100%", "TinyLlama, BF16 and FP16, §6.1", "pairs",
        _ear, select={"axis": "repeat", "precision": ANY}, models=_TINY, by=("model", "precision"), show="range",
        detail=_pairs_detail),
    Row(PRECISION, "BF16 vs FP16 exact agreement, loose and strict determinism", "41%, under both",
        "TinyLlama, GSM8K, §6.1", "pairs", _ear, select={**_BF16_FP16, "deterministic": ANY}, models=_TINY,
        benchmarks=("gsm8k",), bare=True, by=("model", "deterministic"), detail=_pairs_detail),
    Row(PRECISION, "BF16 vs FP16 divergence on MATH-500", "44% (TinyLlama); 30% (Llama-3.2-3B)",
        "n = 50, App. VII", "pairs", _rate, select=_BF16_FP16, models=("TinyLlama", "Llama-3.2-3B"),
        benchmarks=("math500",), bare=True, stand_in=False, detail=_pairs_detail),
    Row(PRECISION, "reasoning- vs instruction-tuned at matched scale", "10–15 pp lower EAR",
        "DS-R1-Distill-Qwen vs Qwen2.5-Instruct, 1.5B and 7B, §6.5", "pairs", _ear, fmt=str, select=_BF16_FP16,
        models=("DS-R1-Qwen-1.5B", "Qwen2.5-1.5B", "DS-R1-Qwen-7B", "Qwen2.5-7B"), benchmarks=_CODE_MATH,
        bare=True, across=_matched_pairs),
    Row(PRECISION, "σz, per-logit RMS of the logit difference", "0.026", "TinyLlama, §I.3", "precision_steps",
        _rms_sigma, fmt=_num, models=_TINY,
        detail=lambda r: f"precision probe, full vocabulary, {len(r)} step(s)"),
    Row(PRECISION, "median top-2 margin, Diverged vs Agreed prompts",
        "0.039 vs 5.733 (TinyLlama); 0.088 vs 7.925 (Qwen2.5-3B)", "final-layer logit lens, §I.3, App. III", "lens",
        _final_margins, fmt=_both(_num), models=_TINY_QWEN,
        detail=lambda r: (lambda c: f"final-layer lens, {c.get('diverged', 0)} Diverged vs {c.get('agreed', 0)} "
                                    f"Agreed prompt(s)")(r[_last_layer(r)]["group"].value_counts())),
    Row(PRECISION, "lens margin from first to last layer, Diverged; Agreed", "0.33 → 0.04; 2.06 → 5.73",
        "TinyLlama, App. II(iv), Table 10", "lens", _margin_trend, fmt=str, models=_TINY),
    Row(PRECISION, "top-1 agreement of the two precisions at body layers", "93–100%", "TinyLlama, App. II(iv)",
        "lens", _body_agreement, fmt=str, models=_TINY,
        detail=lambda r: f"body layers at the first flip, {r.loc[r['group'] == 'diverged', 'prompt_id'].nunique()} "
                         "prompt(s)"),
    Row(PRECISION, "first token: top-1 agreement, mean top-2 margin", "100%, 0.70", "TinyLlama, 100 prompts, "
        "App. II(i)", "lens", _first_token, fmt=str, models=_TINY),
    Row(PRECISION, "LM head's share of the per-logit perturbation", "97.6%", "estimated, TinyLlama, §7.3",
        "precision_steps", _head_share, models=_TINY, detail=lambda r: "measured, σ_head² / (σ_head² + σ_body²)"),
    *(Row(PRECISION, claim, figure, "TinyLlama, App. II(ii)-(iii), Table 8", "grafting", _graft(*args),
          models=_TINY, detail=lambda r: f"{len(r)} graft(s) at flip steps") for claim, figure, args in (
        ("flips fixed by grafting FP16's embedding into BF16", "29.4%", ("embedding", "bf16", "fp16")),
        ("flips fixed by grafting one FP16 body layer into BF16", "≈ 36%", ("layer", "bf16", "fp16", "body")),
        ("flips fixed by grafting FP16's last layer into BF16", "65%", ("layer", "bf16", "fp16", "last")),
        ("flips fixed by grafting FP16's final norm into BF16", "71%", ("final_norm", "bf16", "fp16")),
        ("KV-cache graft, FP16's own cache into BF16", "47.5%", ("kv_cache", "bf16", "fp16")),
        ("KV-cache graft, BF16's own cache into FP16", "35.6%", ("kv_cache", "fp16", "bf16")))),
    Row(PRECISION, "flip predicted from the body's projection vs the margin", "88% (TinyLlama); 89% (Qwen2.5-3B)",
        "traced steps, App. XII", "traced_steps", _body_rule, models=_TINY_QWEN, detail=_traced_detail),
    Row(PRECISION, "flip predicted by the RMS-scale trigger (margin < √2·σz)", "88–89% of steps",
        "TinyLlama, Qwen2.5-3B, §7.1 (a heuristic)", "traced_steps", _rms_rule, models=_TINY_QWEN,
        detail=_traced_detail),
    Row(PRECISION, "body projection, Diverged vs Agreed steps; their margins",
        "equivalent; margins 10²–10³ apart", "TinyLlama, Qwen2.5-3B, App. XII, Table 20", "traced_steps",
        _body_projection, fmt=str, models=_TINY_QWEN, detail=_traced_detail),
    Row(PRECISION, "gated FP32 head (C): EAR lift", "+22–36 pp", "1–3B Llama family: TinyLlama +22, "
        "Llama-3.2-3B +36; A10G, batch size 1 (abstract, App. IV)", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C"}, models=("TinyLlama", "Llama-3.2-3B"), show="range",
        detail=lambda r: f"n = {int(r['n'].sum())}, lift pooled over each model's benchmarks"),
    Row(PRECISION, "gated FP32 head (C): latency overhead", "< 4%", "A10G, batch size 1, Table 3", "interventions",
        _overhead, bare=True, select={"intervention": "C"}, models=("TinyLlama", "Llama-3.2-3B"), show="range",
        detail=lambda r: "compute time per token of both cells against no intervention (the largest)"),
    Row(PRECISION, "gated FP32 head (C): lift per model", "+36 Llama-3.2-3B, +22 TinyLlama, +3 Qwen2.5-3B, "
        "+8 Mistral-7B, +10 OLMoE, 0 DS-R1-Qwen-7B", "App. IV, Table 12", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C"},
        models=("Llama-3.2-3B", "TinyLlama", "Qwen2.5-3B", "Mistral-7B", "OLMoE", "DS-R1-Qwen-7B")),
    Row(PRECISION, "gated FP32 head (C) at batch sizes 2 and 4", "+7–8 pp", "App. IV", "interventions", _lift,
        fmt=_pp, bare=True, select={"intervention": "C", "batch_size": (2, 4)}, by=("model", "batch_size"), show="range"),
    Row(PRECISION, "gated FP32 head (C) at batch size 8", "0 pp", "App. IV, §I.6", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C", "batch_size": 8}, show="range"),
    Row(PRECISION, "gated FP32 head (C) with FlashAttention-2", "remains positive", "§1, §8.1", "interventions",
        _lift, fmt=_pp, bare=True, select={"intervention": "C", "attention": "flash_attention_2"}),
    Row(PRECISION, "cost per trigger, whole head (C) over top-8 (B)", "≈ 4000×", "§4.2", "cells", len, fmt=str,
        select={"intervention": ANY, "precision": ANY}, bare=True, across=_cost_per_trigger,
        detail=lambda r: "extra compute time per token ÷ trigger rate, from the cells"),
    Row(PRECISION, "prompt length where head-only repair stops sufficing", "≈ 850 tokens",
        "TinyLlama, estimated, §I.5", "cells", _prompt_length, fmt=str, models=_TINY, select={"precision": ANY},
        detail=lambda r: "the longest prompt of this run (beyond the boundary, C's lift should fade)"),
    Row(PRECISION, "hidden-state difference, batch size 1 vs 8", "0.0127", "§I.6", "cells", _prompt_length,
        unmeasured="not measured: no probe replays a prompt at two batch sizes"),
)
