"""The cost of each cache form against the default: time per generated token, in one process.

Greedy, cache on, batch size 1, the decode loop every cell runs. Variants (the `caches`
module's forms), alternated round by round over the same prompts:
  default          DynamicCache, the prompt in one forward
  prefill_chunk=N  the prompt prefilled N tokens at a time (--chunk, default 16)
  prefix_cache     the prompts' shared prefix (system turn and one worked example) computed
                   once; each prompt prefills only its own tokens from a copy of its cache
                   (the prefix's own forward is timed once and reported beside)
  kv_dtype=...     fp8_e4m3, fp8_e5m2, int4 (quanto): keys and values stored quantized
  cache_impl=static
  compile=on       static cache, decode steps through the compiled call (inductor); its
                   compilation is timed once, before the rounds, and reported beside

Each variant's tokens are compared with the default's (how many prompts agree token for
token). Ratios are medians of per-round ratios on CPU time (wall time on CUDA).

  .venv/bin/python perf/cache_forms.py [--quick] [--precision bf16]
"""

from __future__ import annotations

import argparse
import time

import _common as c
import torch

from tokenflip.run.caches import CacheForm, kv_dtype_unavailable, shared_prefix


def exemplar_prompts(tokenizer, n: int) -> list[list[int]]:
    """Chat prompts that share a system turn and a worked example, as few-shot prompts do."""
    example = ("Example: A shop sells 4 pens for $3. How much do 12 pens cost? 12 pens are 3 groups of 4, "
               "so they cost 3 * $3 = $9. #### 9")
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": c.SYSTEM + " " + example},
                    {"role": "user", "content": c.QUESTIONS[i % len(c.QUESTIONS)]}]
        if tokenizer is None:
            raise SystemExit("prefix_cache needs a tokenizer: use --model smollm2")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p)
    p.add_argument("--quick", action="store_true", help="fewer prompts, tokens and rounds")
    p.add_argument("--prompts", type=int, default=None, help="prompts per round (default 4, 2 with --quick)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 32 (16 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3, 2 with --quick)")
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--no-compile", action="store_true", help="leave out compile=on (its compilation takes a minute)")
    args = p.parse_args(argv)
    c.setup(args)
    n = args.prompts or (2 if args.quick else 4)
    new_tokens = args.new_tokens or (16 if args.quick else 32)
    rounds = args.rounds or (2 if args.quick else 3)
    c.header("cache forms vs the default cache", args, args.device)
    t_start = time.perf_counter()
    model, tokenizer = c.load_model(args, args.precision)
    pad = c.pad_id(model, tokenizer)
    prompts = exemplar_prompts(tokenizer, n)
    common_ids = shared_prefix(prompts)
    forms = {"default": CacheForm(), f"prefill_chunk={args.chunk}": CacheForm(prefill_chunk=args.chunk),
             "prefix_cache": CacheForm(prefix_cache=True)}
    for kv in ("fp8_e4m3", "fp8_e5m2", "int4"):
        reason = kv_dtype_unavailable(kv)
        if reason:
            print(f"# kv_dtype={kv} left out: {reason}")
        else:
            forms[f"kv_dtype={kv}"] = CacheForm(kv_dtype=kv)
    forms["cache_impl=static"] = CacheForm(impl="static")
    if not args.no_compile:
        forms["compile=on"] = CacheForm(impl="static", compiled=True)
    print(f"model: {args.model} {args.precision}, greedy, cache on, batch size 1, {n} prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens sharing {len(common_ids)}, "
          f"{new_tokens} new tokens each, {rounds} rounds (+1 warm-up)")

    prefix_seconds = c.timed(lambda: forms["prefix_cache"].prefix(model, common_ids), args.device)
    prefix = prefix_seconds[2]
    print(f"shared prefix ({len(common_ids)} tokens) computed once: wall {prefix_seconds[0]:.3f} s, "
          f"CPU {prefix_seconds[1]:.3f} s")

    def runner(form: CacheForm):
        return lambda: c.greedy_tokens(model, prompts, pad, new_tokens, form=form,
                                       prefix=prefix if form.prefix_cache else None)

    variants = {name: runner(form) for name, form in forms.items()}
    if "compile=on" in variants:
        torch._dynamo.reset()
        compile_time = c.timed(variants["compile=on"], args.device)
        print(f"compile=on: first run (compilation included): wall {compile_time[0]:.1f} s, "
              f"CPU {compile_time[1]:.1f} s")
    tokens: dict[str, list] = {}
    times = c.interleave(variants, rounds, args.device, seed=args.seed,
                         on_result=lambda name, out: tokens.setdefault(name, out))
    work = n * new_tokens
    print(f"\nper variant ({times.primary_name} ratios: median of per-round ratios, IQR in brackets):")
    summary = []
    for name in variants:
        ratio = times.ratio(name, "default")
        same = sum(a == b for a, b in zip(tokens[name], tokens["default"]))
        per_token = c.median(times.primary[name]) / work
        print(f"  {times.line(name, work)}  {1e3 * per_token:7.2f} ms/token  x{ratio[0]:.3f} "
              f"[{ratio[1]:.3f}-{ratio[2]:.3f}] of default; {same}/{n} prompts token-identical to default")
        if name != "default":
            summary.append(f"{name} x{ratio[0]:.2f} ({same}/{n} same)")
    print("\nsummary: time per generated token vs default: " + "; ".join(summary))
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
