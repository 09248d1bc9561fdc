"""llama.cpp's time per generated token beside transformers', in one process.

SmolLM2-135M-Instruct: the GGUF the default ships, in llama.cpp (llama-cpp-python, one
thread) with the cache on and off, against the transformers model prepared from the same
file (dequantised to fp32) in tokenflip's decode loop with the cache on and off. Greedy,
batch size 1, the same chat prompts, no EOS (every variant generates the same number of
tokens); the variants alternate round by round. Ratios are medians of per-round ratios
of process CPU time, against transformers fp32 with the cache on.

Each variant's tokens are compared with transformers fp32's, and llama.cpp's cache off
with its cache on (how many prompts agree token for token).

  .venv/bin/python perf/engines.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import _common as c

from tokenflip.run.engines import unavailable
from tokenflip.run.engines.llama_cpp_gguf import LlamaCpp, gguf_path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer prompts, tokens and rounds")
    p.add_argument("--model-dir", default=None, help="an already prepared SmolLM2 directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if unavailable("llama.cpp"):
        raise SystemExit(unavailable("llama.cpp"))
    args.model, args.device, args.threads, args.layers = "smollm2", "cpu", 1, None
    c.setup(args)
    n, new_tokens, rounds = (2, 16, 2) if args.quick else (4, 32, 3)
    c.header("llama.cpp vs transformers, time per generated token", args, "cpu")
    t_start = time.perf_counter()
    model_dir = c.prepared_dir(c.SMOLLM2, args.model_dir)
    args.model_dir = model_dir
    model, tokenizer = c.load_model(args, "fp32")
    pad = c.pad_id(model, tokenizer)
    prompts = c.prompts(tokenizer, n)
    engines = {precision: LlamaCpp(gguf_path(c.SMOLLM2), precision, max(map(len, prompts)) + new_tokens, 1)
               for precision in ("fp32", "fp16")}
    print(f"model: SmolLM2-135M-Instruct ({c.SMOLLM2['file']}), greedy, batch size 1, {n} prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {new_tokens} new tokens each, "
          f"{rounds} rounds (+1 warm-up); llama.cpp: {engines['fp32'].describe()['system_info'].strip()}")

    def transformers_run(use_cache: bool):
        return lambda: c.greedy_tokens(model, prompts, pad, new_tokens, use_cache=use_cache)

    def llama_run(precision: str, use_cache: bool):
        from tokenflip.run.decode import greedy

        def run():
            return [engines[precision].decode(ids, max_new_tokens=new_tokens, use_cache=use_cache,
                                              eos_token_ids=c.NO_EOS, record_top_k=16, select=greedy,
                                              stop=None).generations[0].token_ids for ids in prompts]
        return run

    variants = {"transformers fp32 cache on": transformers_run(True),
                "transformers fp32 cache off": transformers_run(False),
                "llama.cpp fp32 (F32 KV) cache on": llama_run("fp32", True),
                "llama.cpp fp32 (F32 KV) cache off": llama_run("fp32", False),
                "llama.cpp fp16 (F16 KV) cache on": llama_run("fp16", True),
                "llama.cpp fp16 (F16 KV) cache off": llama_run("fp16", False)}
    base = "transformers fp32 cache on"
    tokens: dict[str, list] = {}
    times = c.interleave(variants, rounds, "cpu", seed=args.seed,
                         on_result=lambda name, out: tokens.setdefault(name, out))
    work = n * new_tokens
    print(f"\nper variant ({times.primary_name} ratios: median of per-round ratios, IQR in brackets):")
    for name in variants:
        ratio = times.ratio(name, base)
        same = sum(a == b for a, b in zip(tokens[name], tokens[base]))
        per_token = c.median(times.primary[name]) / work
        print(f"  {times.line(name, work)}  {1e3 * per_token:7.2f} ms/token  x{ratio[0]:.3f} "
              f"[{ratio[1]:.3f}-{ratio[2]:.3f}] of {base}; {same}/{n} prompts token-identical to it")
    for precision in ("fp32", "fp16"):
        on, off = (tokens[f"llama.cpp {precision} ({'F32' if precision == 'fp32' else 'F16'} KV) cache {m}"]
                   for m in ("on", "off"))
        print(f"llama.cpp {precision}: cache on vs off token-identical on {sum(a == b for a, b in zip(on, off))}/{n}")
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
