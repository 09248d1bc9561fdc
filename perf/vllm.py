"""vLLM beside transformers on the same prepared SmolLM2-135M-Instruct: engine start, time
per generated token, and throughput with one request in flight vs all of them.

transformers runs tokenflip's decode loop one prompt at a time (batch size 1) in this
process; vLLM runs in its own environment (`make vllm`), one engine per concurrency
(`max_num_seqs` 1 and N = every prompt), each measured pass repeated `rounds` times after
a warm-up pass inside the same engine. Greedy, fp32 (or --precision), the same prompt ids,
EOS ignored: every prompt generates exactly `new` tokens. Time per token is CPU time:
this process's for transformers, the CPU time of vLLM's whole process tree (its worker,
engine core and model workers, measured by the worker) for vLLM, so that other load on a
shared machine does not enter; wall times are printed beside them. Quote them with the CPU.

  .venv/bin/python perf/vllm.py [--quick] [--precision bf16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import _common as c

from tokenflip.core.specs import Cell
from tokenflip.run.engines import VLLM, unavailable
from tokenflip.run.engines.vllm_offline.engine import DTYPES, call_worker, engine_env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer prompts, tokens and rounds")
    p.add_argument("--model-dir", default=None, help="an already prepared SmolLM2 directory")
    p.add_argument("--precision", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if unavailable(VLLM):
        raise SystemExit(unavailable(VLLM))
    args.model, args.device, args.threads, args.layers = "smollm2", "cpu", 1, None
    c.setup(args)
    n, new, rounds = (4, 16, 2) if args.quick else (12, 32, 3)
    c.header("vLLM vs transformers: start, time per token, throughput", args, "cpu")
    model_dir = c.prepared_dir(c.SMOLLM2, args.model_dir)
    args.model_dir = model_dir
    model, tokenizer = c.load_model(args, args.precision)
    pad = c.pad_id(model, tokenizer)
    prompts = c.prompts(tokenizer, n)
    print(f"{n} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {new} new tokens, "
          f"{args.precision}, {rounds} rounds after a warm-up")

    hf_times, hf_cpu, hf_tokens = [], [], None
    c.greedy_tokens(model, prompts, pad, new, use_cache=True)  # warm-up
    for _ in range(rounds):
        start, cpu = time.perf_counter(), time.process_time()
        hf_tokens = c.greedy_tokens(model, prompts, pad, new, use_cache=True)
        hf_times.append(time.perf_counter() - start)
        hf_cpu.append(time.process_time() - cpu)
    hf_work = sum(len(t) for t in hf_tokens)
    hf_per_token = statistics.median(hf_cpu) / hf_work
    print(f"\ntransformers, one prompt at a time: {1e3 * hf_per_token:.2f} CPU-ms/token "
          f"({hf_work} tokens a round; wall {', '.join(f'{t:.2f}' for t in hf_times)} s)")

    results = {}
    for concurrency in (1, n):
        req = {"model": str(Path(model_dir).resolve()),
               "engine_args": {"dtype": DTYPES[args.precision], "seed": args.seed,
                               "max_model_len": max(map(len, prompts)) + new, "logprobs_mode": "raw_logits",
                               "max_logprobs": 16, "enforce_eager": True, "enable_prefix_caching": False,
                               "max_num_seqs": concurrency, "disable_log_stats": True},
               "top_k": 16, "prompts": prompts, "max_tokens": new, "sampling": {"temperature": 0.0, "ignore_eos": True},
               "seeds": [None] * n, "stop": [], "stop_token_ids": [], "warm_prefix_cache": False,
               "env_keys": [], "rounds": rounds + 1}
        with tempfile.TemporaryDirectory() as tmp:
            # The cores and threads a vLLM cell's job gives it (its own CPU set, one core left to vLLM).
            cell = Cell("smollm2", "perf", args.precision, "on", 1, "greedy", "none", engine="vllm")
            env = engine_env(SimpleNamespace(cell=cell, threads=None), "cpu")
            response = call_worker(req, env, Path(tmp))
        work = sum(len(r["token_ids"]) for r in response["outputs"])
        measured = response["timing"]["rounds_s"][1:]
        same = sum(r["token_ids"] == list(t) for r, t in zip(response["outputs"], hf_tokens))
        cpu_rounds = response["timing"]["rounds_cpu_s"][1:]
        results[concurrency] = {"start_s": response["timing"]["start_s"], "rounds_s": measured, "tokens": work,
                                "per_token_s": statistics.median(cpu_rounds) / work, "same_as_transformers": same,
                                "cpu_s_rounds": cpu_rounds}
        print(f"vLLM, max_num_seqs {concurrency}: engine start {response['timing']['start_s']:.1f} s; "
              f"{1e3 * results[concurrency]['per_token_s']:.2f} CPU-ms/token "
              f"({work / statistics.median(cpu_rounds):.1f} tokens per CPU-second; wall "
              f"{', '.join(f'{t:.2f}' for t in measured)} s); {same}/{n} prompts token-identical to transformers")
    one, all_ = results[1], results[n]
    print(f"\nsummary: vLLM at 1 request {one['per_token_s'] / hf_per_token:.2f}x transformers' time per token, "
          f"at {n} requests {all_['per_token_s'] / hf_per_token:.2f}x; throughput {n} vs 1 in flight "
          f"{one['per_token_s'] / all_['per_token_s']:.2f}x per CPU-second; engine start {one['start_s']:.0f}-{all_['start_s']:.0f} s")
    print(json.dumps({"transformers_per_token_s": hf_per_token, "vllm": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
