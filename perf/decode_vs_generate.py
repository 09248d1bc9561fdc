"""tokenflip's decode loop vs transformers `generate()`: tokens/s at batch sizes 1 and 8.

Greedy, KV cache on, same inputs and settings on both sides (the loop is bitwise equal
to generate(); this script checks the tokens too). Every run generates exactly
--new-tokens tokens (an EOS id no model produces), so both sides time the same work.

Variants, alternated round by round in one process:
  generate           model.generate(do_sample=False, use_cache=True)
  decode             tokenflip.decode.decode with the default per-step record (top-16,
                     margin, logsumexp, entropy, intervention flag), as every cell runs
  decode-norecord    the same loop with `record_step` replaced by one that keeps only the
                     chosen token (recording cannot be turned off in the loop itself)

Targets (issue "Performance"): decode ≥ 1.0× generate's tokens/s; recording ≤ 3% of the
loop's time. A microbenchmark beside it times `record_step` (step_statistics + the copies
to Python) on real last-step logits, against the per-step time of the forward pass.

  .venv/bin/python perf/decode_vs_generate.py [--quick]
  python perf/decode_vs_generate.py --model random-1b --device cuda     # gpu.sh
"""

from __future__ import annotations

import argparse
import contextlib
import time

import _common as c
import torch

import tokenflip.decode as decode_mod
from tokenflip.decode import Generation, decode


def _record_token_only(generations, logits, chosen, unfinished, k, fired):
    chosen = chosen.cpu().tolist()
    active = unfinished.cpu().tolist()
    for row, gen in enumerate(generations):
        if active[row]:
            gen.token_ids.append(int(chosen[row]))


@contextlib.contextmanager
def no_recording():
    saved = decode_mod.record_step
    decode_mod.record_step = _record_token_only
    try:
        yield
    finally:
        decode_mod.record_step = saved


def record_cost(model, ids, mask, pad, k: int, device: str, reps: int) -> float:
    """Seconds per call (on `c.clock`) of the loop's `record_step` on this batch's real first-step logits."""
    with torch.inference_mode():
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=1)
    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
    chosen = torch.argmax(logits, dim=-1)
    unfinished = torch.ones(ids.shape[0], dtype=torch.bool, device=logits.device)
    times, clock = [], c.clock(device)
    for _ in range(5):  # median of 5 blocks of `reps` calls
        gens = [Generation() for _ in range(ids.shape[0])]
        c.sync(device)
        t0 = clock()
        for _ in range(reps):
            decode_mod.record_step(gens, logits, chosen, unfinished, k, None)
        c.sync(device)
        times.append((clock() - t0) / reps)
    return c.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p)
    p.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=None, help="default: 32 on a CPU (16 with --quick), 128 on CUDA")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default: 4, 3 with --quick; 10 on CUDA)")
    p.add_argument("--top-k", type=int, default=16)
    args = p.parse_args(argv)
    c.setup(args)
    cuda = args.device == "cuda"
    new_tokens = args.new_tokens or (128 if cuda else 16 if args.quick else 32)
    rounds = args.rounds or (10 if cuda and not args.quick else 5 if cuda else 3 if args.quick else 4)
    c.header("decode loop vs generate()", args, args.device)
    t_start = time.perf_counter()
    model, tokenizer = c.load_model(args, args.precision)
    pad = c.pad_id(model, tokenizer)
    forward = c.ModuleClock(model, args.device)
    print(f"model: {args.model} {args.precision} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"parameters), greedy, cache on, {new_tokens} new tokens per row, {rounds} rounds (+1 warm-up)")
    results = {}
    for bs in args.batch_sizes:
        ids, mask = c.batch(tokenizer, model, bs, args.seed)
        if bs == 1:
            keep = mask[0].bool()
            ids, mask = ids[:, keep], mask[:, keep]
        dev_ids, dev_mask = ids.to(args.device), mask.to(args.device)
        common = dict(max_new_tokens=new_tokens, use_cache=True, eos_token_ids=c.NO_EOS, pad_token_id=pad)

        def run_generate():
            forward.take()
            with torch.inference_mode():
                out = model.generate(input_ids=dev_ids, attention_mask=dev_mask, max_new_tokens=new_tokens,
                                     do_sample=False, use_cache=True, eos_token_id=c.NO_EOS, pad_token_id=pad)
            return out[:, ids.shape[1]:].tolist(), forward.take()

        def run_decode():
            forward.take()
            res = decode(model, ids, mask, record_top_k=args.top_k, **common)
            return [g.token_ids for g in res.generations], forward.take()

        def run_norecord():
            forward.take()
            with no_recording():
                res = decode(model, ids, mask, record_top_k=args.top_k, **common)
            return [g.token_ids for g in res.generations], forward.take()

        variants = {"generate": run_generate, "decode": run_decode, "decode-norecord": run_norecord}
        tokens: dict[str, list] = {}
        fwd: dict[str, list[tuple[float, int]]] = {name: [] for name in variants}

        def keep_result(name, out):
            tokens.setdefault(name, out[0])
            fwd[name].append(out[1])

        times = c.interleave(variants, rounds, args.device, seed=args.seed + bs, on_result=keep_result)
        if cuda:  # forward-pass times need synchronising hooks: a separate, untimed pass
            for name in fwd:
                fwd[name].clear()
            forward.active = True
            probe = c.interleave(variants, 3, args.device, warmup=0, seed=args.seed, on_result=keep_result)
            forward.active = False
        else:
            probe = times
        # Time outside the model's forward pass per step: the loop's own work (recording,
        # bookkeeping; generate's logits processors and stopping criteria).
        outside = {name: c.median([(t - f[0]) / new_tokens for t, f in zip(probe.primary[name], fwd[name])])
                   for name in variants}
        fwd_step = c.median([f[0] / f[1] for name in variants for f in fwd[name] if f[1]])
        same = tokens["generate"] == tokens["decode"] == tokens["decode-norecord"]
        n_tok = bs * new_tokens
        speed = times.ratio("generate", "decode")  # >1: the loop is faster
        rec = times.ratio("decode", "decode-norecord")
        wall_speed = times.wall_ratio("generate", "decode")
        wall_rec = times.wall_ratio("decode", "decode-norecord")
        step = c.median(times.primary["decode-norecord"]) / new_tokens
        micro = record_cost(model, ids, mask, pad, args.top_k, args.device, reps=50 if cuda else 20)
        at_equal_forward = (fwd_step + outside["generate"]) / (fwd_step + outside["decode"])
        rec_at_equal_forward = (fwd_step + outside["decode"]) / (fwd_step + outside["decode-norecord"]) - 1
        results[bs] = dict(speed=speed, rec=rec, micro=micro / step, same=same, eq=at_equal_forward,
                           rec_eq=rec_at_equal_forward)
        print(f"\nbatch size {bs} (prompt {ids.shape[1]} tokens{', left-padded' if bs > 1 else ''}); "
              f"tokens identical across variants: {same}")
        for name in variants:
            print("  " + times.line(name, n_tok))
        print(f"  ratios on {times.primary_name} (median of per-round ratios, IQR in brackets):")
        print(f"  decode / generate throughput: {speed[0]:.3f}x [{speed[1]:.3f}-{speed[2]:.3f}] "
              f"(wall: {wall_speed[0]:.3f}x)   target >= 1.0x: {c.verdict(speed[0], 1.0, lower_is_better=False)}")
        print(f"  recording overhead (decode vs decode-norecord): {100 * (rec[0] - 1):+.2f}% "
              f"[{100 * (rec[1] - 1):+.2f}% to {100 * (rec[2] - 1):+.2f}%] (wall: {100 * (wall_rec[0] - 1):+.2f}%)"
              f"   target <= 3%: {c.verdict(rec[0] - 1, 0.03)}")
        print(f"  per step, forward pass {1e3 * fwd_step:.2f} ms; outside it: generate "
              f"{1e3 * outside['generate']:.3f} ms, decode {1e3 * outside['decode']:.3f} ms, decode-norecord "
              f"{1e3 * outside['decode-norecord']:.3f} ms")
        print(f"  at equal forward time: decode / generate {at_equal_forward:.3f}x, recording "
              f"{100 * rec_at_equal_forward:+.2f}%")
        print(f"  record_step alone: {1e3 * micro:.3f} ms per step = {100 * micro / step:.2f}% of a step "
              f"({1e3 * step:.2f} ms without recording)   target <= 3%: {c.verdict(micro / step, 0.03)}")
    print("\nsummary: " + "; ".join(
        f"bs{bs}: decode/generate {r['speed'][0]:.2f}x end to end, {r['eq']:.3f}x at equal forward time; "
        f"recording {100 * (r['rec'][0] - 1):+.1f}% end to end, {100 * r['rec_eq']:+.2f}% at equal forward time, "
        f"record_step {100 * r['micro']:.1f}% of a step" for bs, r in results.items()))
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0 if all(r["same"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
