"""Part 1: tokenflip's decode loop equals transformers `generate()` bitwise."""

from __future__ import annotations

import time
import traceback
from typing import Any

from .models import REAL_SHAPES, build_random, free, in_precision, model_facts, random_prompts
from .record import Recorder, _finite


def compare_with_generate(model, ids, mask, new_tokens: int, use_cache: bool, eos: int = 2,
                          pad: int = 0) -> dict[str, Any]:
    """Our loop and generate() on the same inputs: tokens and every step's fp32 logits, bitwise."""
    import torch

    from tokenflip.run.decode import decode, greedy

    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits.clone())
        return greedy(logits, step)

    ours = decode(model, ids, mask, max_new_tokens=new_tokens, use_cache=use_cache, eos_token_ids=[eos],
                  pad_token_id=pad, select=select)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, eos_token_id=eos,
                             pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
    first_diff, max_diff = None, 0.0
    for step, (mine, theirs) in enumerate(zip(seen, ref.logits)):
        if not torch.equal(mine, theirs):
            first_diff = step if first_diff is None else first_diff
            max_diff = max(max_diff, float((mine - theirs).abs().max()))
    tokens_equal = True
    for row, gen in enumerate(ours.generations):
        expected = ref.sequences[row, ids.shape[1]:].tolist()
        n = len(gen.token_ids)
        tokens_equal &= gen.token_ids == expected[:n] and all(t == pad for t in expected[n:])
    steps_equal = ours.steps == len(ref.logits)
    record_equal = record_matches(ours.generations, seen)
    ok = steps_equal and first_diff is None and tokens_equal and record_equal
    return {"status": "pass" if ok else "fail", "steps": ours.steps, "generate_steps": len(ref.logits),
            "tokens_equal": tokens_equal, "logits_equal": first_diff is None and steps_equal,
            "record_equal": record_equal,
            "first_logit_diff_step": first_diff, "max_abs_logit_diff": _finite(max_diff),
            "prompt_tokens": int(ids.shape[1])}


def record_matches(generations, step_logits) -> bool:
    """Whether the loop's record (kept on the device, moved once) holds, bitwise, the
    statistics `step_statistics` computes alone from each step's logits."""
    import numpy as np

    from tokenflip.run.step_record import step_statistics

    for step, logits in enumerate(step_logits):
        expected = {name: t.cpu().numpy() for name, t in step_statistics(logits, 16).items()}
        for row, gen in enumerate(generations):
            if step >= len(gen.token_ids):
                continue
            got = {"top_ids": gen.top_ids[step], "top_logits": gen.top_logits[step], "margin": gen.margin[step],
                   "logsumexp": gen.logsumexp[step], "entropy": gen.entropy[step]}
            if not all(np.asarray(got[name]).astype(values.dtype).tobytes() == values[row].tobytes()
                       for name, values in expected.items()):
                return False
    return True


# Seconds an architecture's 8 checks take (an H200 at real widths: 24 checks in 59 s with the
# part's start; tiny shapes on a CPU): what the ones still to come are left.
LATER_ARCH_S = {"real": 20.0, "tiny": 3.0}


def part_decode_equals_generate(rec: Recorder, args) -> None:
    from tokenflip.run.decode import left_pad

    new_tokens = 32 if args.shapes == "real" else 12
    rec.data.update(new_tokens=new_tokens, shapes=args.shapes)
    archs = list(REAL_SHAPES)
    for i, arch in enumerate(archs):
        # Each architecture still to come keeps what it takes on an H200 (about 20 s; 3 s tiny).
        until = rec.leaving(LATER_ARCH_S[args.shapes], len(archs) - i - 1)
        if not rec.room(3.0, until):
            rec.skip(arch, f"{rec.left():.0f} s left")
            continue
        try:
            master = build_random(arch, args.shapes, args.device, args.layers)
        except Exception as exc:  # noqa: BLE001
            rec.add({"name": arch, "status": "error", "error": f"building the model: {exc}",
                     "traceback": traceback.format_exc()[-3000:]})
            continue
        vocab = master.config.vocab_size
        rec.data.setdefault("models", {})[arch] = model_facts(master)
        prompts = random_prompts(4, vocab, seed=10 + i)
        batches = {1: left_pad(prompts[:1], 0), 4: left_pad(prompts, 0)}
        for precision in ("fp16", "bf16"):
            model = in_precision(master, precision)
            rec.data["models"][arch]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            for use_cache in (True, False):
                for bs, (ids, mask) in batches.items():
                    name = f"{arch}/{precision}/cache-{'on' if use_cache else 'off'}/bs{bs}"
                    if not rec.room(1.0, until):
                        rec.skip(name, f"{rec.left():.0f} s left, of which {until - time.time():.0f} s for {arch}")
                        continue
                    check = rec.guarded(name, lambda: compare_with_generate(model, ids, mask, new_tokens, use_cache))
                    check.update(arch=arch, precision=precision, cache=use_cache, batch_size=bs)
                    rec.save()
            del model
            free(args.device)
        del master
        free(args.device)
    from tokenflip.run.step_record import StepRecord

    # How the loop's record ran in these checks: through its CUDA graph, or eagerly and why.
    rec.data["record_graph_use"] = dict(StepRecord.graph_use)
    rec.finish()
