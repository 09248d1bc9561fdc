"""Part 4: cache on vs off and bf16 vs fp16 on the 7B-width models, and CPU vs CUDA."""

from __future__ import annotations

import copy
import os
from typing import Any

from .models import REAL_SHAPES, build_random, free, in_precision, model_facts, random_prompts
from .record import Recorder, _finite


def _run_prompt(model, prompt: list[int], new_tokens: int, use_cache: bool):
    """(tokens, per-step fp32 logits) of one greedy run that generates exactly `new_tokens`."""
    import torch

    from tokenflip.run.decode import decode, greedy

    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits[0].clone())
        return greedy(logits, step)

    ids = torch.tensor([prompt])
    res = decode(model, ids, torch.ones_like(ids), max_new_tokens=new_tokens, use_cache=use_cache,
                 eos_token_ids=[-1], pad_token_id=0, select=select, record_top_k=2)
    return res.generations[0].token_ids, seen


def compare_runs(a, b) -> dict[str, Any]:
    """First divergence of two runs of one prompt, |Δlogit| before it, and a's top-2 margin there."""
    tokens_a, logits_a = a
    tokens_b, logits_b = b
    first = next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), None)
    upto = len(tokens_a) if first is None else first + 1  # the step that diverged still saw the same prefix
    diffs = [float((logits_a[i].float().cpu() - logits_b[i].float().cpu()).abs().max()) for i in range(upto)]
    margin = None
    if first is not None:
        top = logits_a[first].float().topk(2).values
        margin = float(top[0] - top[1])
    return {"first_divergence": first, "step0_max_abs_logit_diff": diffs[0] if diffs else None,
            "max_abs_logit_diff_until_divergence": max(diffs) if diffs else None,
            "step0_bitwise_equal": bool(diffs) and diffs[0] == 0.0, "margin_at_divergence": margin}


def summarise_pairs(per_prompt: list[dict[str, Any]]) -> dict[str, Any]:
    diverged = [p for p in per_prompt if p["first_divergence"] is not None]
    return {"prompts": len(per_prompt), "diverged": len(diverged),
            "token_divergence_rate": len(diverged) / len(per_prompt) if per_prompt else None,
            "first_divergence_steps": [p["first_divergence"] for p in per_prompt],
            "max_abs_logit_diff_until_divergence": _finite(max(
                (p["max_abs_logit_diff_until_divergence"] or 0.0) for p in per_prompt)) if per_prompt else None,
            "step0_max_abs_logit_diff": _finite(max((p["step0_max_abs_logit_diff"] or 0.0) for p in per_prompt))
            if per_prompt else None,
            "step0_bitwise_equal_all": all(p["step0_bitwise_equal"] for p in per_prompt),
            "margins_at_divergence": [_finite(p["margin_at_divergence"]) for p in diverged]}


DIVERGENCE_PAIRS = {
    "cache_on_vs_off/bf16": (("bf16", True), ("bf16", False)),
    "cache_on_vs_off/fp16": (("fp16", True), ("fp16", False)),
    "bf16_vs_fp16/cache_on": (("bf16", True), ("fp16", True)),
    "bf16_vs_fp16/cache_off": (("bf16", False), ("fp16", False)),
}


def part_divergence(rec: Recorder, args) -> None:
    import torch

    real = args.shapes == "real"
    n_prompts, new_tokens = (8, 48) if real else (3, 12)
    rec.data.update(prompts=n_prompts, new_tokens=new_tokens, shapes=args.shapes)
    archs = list(REAL_SHAPES)
    cpu_vs_cuda_seconds = 25.0 if args.device == "cuda" else 0.0
    for i, arch in enumerate(archs):
        until = rec.share(i, len(archs)) - cpu_vs_cuda_seconds / len(archs)
        if not rec.room(3.0, until):
            rec.skip(arch, f"{rec.left():.0f} s left")
            continue

        def run_arch() -> dict[str, Any]:
            master = build_random(arch, args.shapes, args.device, args.layers)
            models = {p: in_precision(master, p) for p in ("bf16", "fp16")}
            facts = model_facts(master)
            del master
            free(args.device)
            prompts = random_prompts(n_prompts, facts["vocab"], seed=100 + i)
            per_pair: dict[str, list] = {name: [] for name in DIVERGENCE_PAIRS}
            done = 0
            for prompt in prompts:
                if done and not rec.room(1.0, until):
                    break
                runs = {(p, cache): _run_prompt(models[p], prompt, new_tokens, cache)
                        for p in ("bf16", "fp16") for cache in (True, False)}
                for name, (a, b) in DIVERGENCE_PAIRS.items():
                    per_pair[name].append(compare_runs(runs[a], runs[b]))
                done += 1
            del models
            free(args.device)
            return {"status": "pass" if done else "skipped", "arch": arch, "model": facts,
                    "prompts_run": done, "pairs": {name: summarise_pairs(v) for name, v in per_pair.items()}}

        rec.guarded(arch, run_arch)
    # The same bf16 weights on the CPU and on CUDA: where the kernels differ.
    if args.device != "cuda":
        rec.skip("cpu_vs_cuda", "the run is on the CPU")
    elif not rec.room(25.0):
        rec.skip("cpu_vs_cuda", f"{rec.left():.0f} s left")
    else:
        def cpu_vs_cuda() -> dict[str, Any]:
            master = build_random("llama", args.shapes, "cuda", args.layers)
            gpu = in_precision(master, "bf16")
            del master
            cpu = copy.deepcopy(gpu).to("cpu")
            torch.set_num_threads(os.cpu_count() or 1)
            per_prompt = []
            for prompt in random_prompts(2, gpu.config.vocab_size, seed=200):
                if per_prompt and not rec.room(10.0):
                    break
                per_prompt.append(compare_runs(_run_prompt(gpu, prompt, 12, True), _run_prompt(cpu, prompt, 12, True)))
            del gpu, cpu
            free("cuda")
            return {"status": "pass", "arch": "llama", "precision": "bf16", "cache": True, "new_tokens": 12,
                    **summarise_pairs(per_prompt)}

        rec.guarded("cpu_vs_cuda", cpu_vs_cuda)
    rec.finish()
