"""Is tokenflip's endpoint client ever the bottleneck? Against one live server, the audit's
client (`engines.endpoint_client.run`: the in-flight record, retries, the order it sends in)
and a plain async client (`openai.AsyncOpenAI`, an `asyncio.Semaphore`, `gather`) send the
same requests at 1, 8 and 32 in flight, alternated round by round; the figure is the median
of the per-round ratios of requests per second (target: within 5%), with the requests in
flight the audit's client recorded beside it.

    .venv/bin/python perf/endpoint_throughput.py [--quick] [--server vllm|llama.cpp] [--url URL --model NAME]

Without `--url` it starts vLLM's own server on SmolLM2 (bf16; `make vllm` first), or
llama.cpp's (`--server llama.cpp`, which serves one request at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from _common import SMOLLM2, machine, median, prepared_dir

from tokenflip.run.engines.endpoint import client as endpoint_client
from tokenflip.run.engines.local_servers import Server, free_port, gguf_of, llama_cpp_command, vllm_command, vllm_env


def bodies(model: str, n: int, max_tokens: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"model": model, "prompt": " ".join(rng.choice(["the", "a", "cat", "sat", "on", "mat", "and", "ran"])
                                              for _ in range(48)),
             "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 4} for _ in range(n)]


async def plain(spec: dict, requests: list[dict], concurrency: int) -> None:
    import openai

    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=spec["url"], api_key="none", max_retries=0,
                                  timeout=spec["timeout_s"]) as api:
        async def one(body):
            async with gate:
                await api.completions.create(**body)

        await asyncio.gather(*(one(b) for b in requests))


async def audit(spec: dict, requests: list[dict], concurrency: int) -> dict:
    _, traffic = await endpoint_client.run(spec, [(f"request {i}", b) for i, b in enumerate(requests)], concurrency,
                                           None, None)
    return traffic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--server", choices=["vllm", "llama.cpp"], default="vllm")
    parser.add_argument("--url")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    levels = (1, 8) if args.quick else (1, 8, 32)
    n, max_tokens = (16, 8) if args.quick else (32, 8)
    server = None
    if args.url is None:
        port = free_port()
        log = Path(tempfile.mkdtemp(prefix="tokenflip-perf-")) / "server.log"
        command, env = ((vllm_command(prepared_dir(SMOLLM2), port, args.model, "bf16"), vllm_env())
                        if args.server == "vllm" else (llama_cpp_command(gguf_of(SMOLLM2), port, args.model), {}))
        server = Server(command, f"http://127.0.0.1:{port}/v1", args.model, log, env).start(timeout=900)
        args.url = server.url
    spec = {"url": args.url, "model": args.model, "api": "completions", "timeout_s": 600, "retries": 0}
    print(f"# endpoint client throughput: {args.url} ({args.server if server else 'given'}), {n} requests of "
          f"{max_tokens} tokens, {rounds} rounds; {machine()}")
    try:
        asyncio.run(plain(spec, bodies(args.model, 4, 4, 99), 4))  # warm-up
        summary = []
        for level in levels:
            ratios, audit_rps, plain_rps, held = [], [], [], []
            for r in range(rounds):
                requests = bodies(args.model, n, max_tokens, seed=r)
                timings = {}
                for name in random.Random(r).sample(["audit", "plain"], 2):
                    start = time.perf_counter()
                    if name == "audit":
                        traffic = asyncio.run(audit(spec, requests, level))
                        held.append(traffic["mean_in_flight"])
                    else:
                        asyncio.run(plain(spec, requests, level))
                    timings[name] = time.perf_counter() - start
                audit_rps.append(n / timings["audit"])
                plain_rps.append(n / timings["plain"])
                ratios.append(timings["plain"] / timings["audit"])
            ratio = median(ratios)
            print(f"{level:>3} in flight: audit {median(audit_rps):6.2f} req/s, plain {median(plain_rps):6.2f} req/s, "
                  f"audit/plain {ratio:.3f} (rounds {', '.join(f'{x:.3f}' for x in ratios)}); "
                  f"the audit's client held {median(held):.2f} in flight on average")
            summary.append(f"{level}: {ratio:.3f}")
        print(f"summary: audit/plain requests per second (median of rounds) at {'; '.join(summary)} "
              f"(target: at least 0.95)")
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
