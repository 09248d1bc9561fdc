"""Time per generated token with the KV cache on and off, at 32/64/128/256 new tokens.

With the cache, each step feeds one token: the time per token stays flat. Without it,
step t recomputes the whole prefix (prompt + t tokens), so the time per step grows
linearly with t and the total time of N tokens quadratically; this is what makes cache-off
cells the slowest ones of a run.

One decode per variant and round to the largest N, with a selector hook that stamps the
clock after every step's forward pass; the time per token at N is the time to the N-th
step divided by N (the same as a run of N tokens). Variants alternate round by round; on a
CPU the clock is this process's CPU time (single-threaded torch), so other load on a
shared machine barely moves it. A least-squares fit of the cache-off step time against
the context length gives the linear growth per step.

  .venv/bin/python perf/cache_off_scaling.py [--quick]        # --quick: 32/64/128
"""

from __future__ import annotations

import argparse
import time

import _common as c
import numpy as np

from tokenflip.run.decode import decode, greedy


def run(model, ids, mask, pad, n: int, use_cache: bool, device: str) -> tuple[list[float], float]:
    """Clock stamps after each step's forward pass, relative to the start; and the wall time."""
    clock = c.clock(device)
    stamps: list[float] = []

    def select(logits, step):
        c.sync(device)
        stamps.append(clock())
        return greedy(logits, step)

    c.sync(device)
    t0, w0 = clock(), time.perf_counter()
    decode(model, ids, mask, max_new_tokens=n, use_cache=use_cache, eos_token_ids=c.NO_EOS,
           pad_token_id=pad, record_top_k=16, select=select)
    return [s - t0 for s in stamps], time.perf_counter() - w0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p)
    p.add_argument("--quick", action="store_true", help="32/64/128 new tokens")
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--rounds", type=int, default=1, help="rounds of (cache on, cache off); the per-N time is "
                   "the median over rounds")
    args = p.parse_args(argv)
    c.setup(args)
    lengths = sorted(args.lengths or ([32, 64, 128] if args.quick else [32, 64, 128, 256]))
    n = lengths[-1]
    c.header("KV cache on vs off: time per generated token", args, args.device)
    t_start = time.perf_counter()
    model, tokenizer = c.load_model(args, args.precision)
    pad = c.pad_id(model, tokenizer)
    ids, mask = c.batch(tokenizer, model, 1, args.seed)
    prompt = ids.shape[1]
    print(f"model: {args.model} {args.precision}, batch size 1, prompt {prompt} tokens, up to {n} new tokens, "
          f"{args.rounds} round(s); clock: {'wall' if args.device == 'cuda' else 'CPU'} time")
    # Warm-up: a few steps of each.
    for use_cache in (True, False):
        run(model, ids, mask, pad, 4, use_cache, args.device)
    stamps: dict[str, list[list[float]]] = {"on": [], "off": []}
    walls: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            s, w = run(model, ids, mask, pad, n, mode == "on", args.device)
            stamps[mode].append(s)
            walls[mode].append(w)

    def per_token(mode: str, k: int) -> float:
        return float(np.median([s[k - 1] / k for s in stamps[mode]]))

    print(f"\n{'new tokens':>10} {'on ms/tok':>10} {'off ms/tok':>11} {'off/on':>7} {'off total s':>12}")
    for k in lengths:
        on, off = per_token("on", k), per_token("off", k)
        print(f"{k:>10} {1e3 * on:>10.2f} {1e3 * off:>11.2f} {off / on:>7.2f} {off * k:>12.2f}")
    first, last = lengths[0], lengths[-1]
    growth_on = per_token("on", last) / per_token("on", first)
    growth_off = per_token("off", last) / per_token("off", first)
    # Per-step times (differences of the stamps; step 0 is the prefill in both modes).
    steps_off = np.median(np.diff(np.asarray(stamps["off"]), axis=1), axis=0)
    steps_on = np.median(np.diff(np.asarray(stamps["on"]), axis=1), axis=0)
    context = prompt + np.arange(1, n)  # tokens fed at steps 1..n-1 without a cache
    slope, intercept = np.polyfit(context, steps_off, 1)
    pred = slope * context + intercept
    r2 = 1 - np.sum((steps_off - pred) ** 2) / np.sum((steps_off - steps_off.mean()) ** 2)
    on_slope = np.polyfit(np.arange(1, n), steps_on, 1)[0]
    print(f"\nper-token time from {first} to {last} new tokens: cache on x{growth_on:.2f}, "
          f"cache off x{growth_off:.2f} (x{last / first:.0f} more tokens)")
    print(f"cache-off step time = {1e3 * intercept:.2f} ms + {1e3 * slope:.3f} ms per token of context "
          f"(R^2 {r2:.3f}): linear per step, quadratic in total; cache-on step time changes by "
          f"{1e3 * on_slope:+.4f} ms per step")
    print(f"wall time of the {n}-token runs: cache on {np.median(walls['on']):.1f} s, "
          f"cache off {np.median(walls['off']):.1f} s")
    print(f"\nsummary: cache off / on per token: " + ", ".join(
        f"{k}: {per_token('off', k) / per_token('on', k):.1f}x" for k in lengths)
        + f"; off per-token time grows x{growth_off:.2f} from {first} to {last} tokens (on: x{growth_on:.2f})")
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
