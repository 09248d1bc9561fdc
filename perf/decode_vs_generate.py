"""tokenflip's decode loop vs transformers `generate()`: tokens/s at batch sizes 1, 8 and 32.

Greedy, KV cache on, same inputs and settings on both sides (the loop is bitwise equal
to generate(); this script checks the tokens too). Every run generates exactly
--new-tokens tokens (an EOS id no model produces), so both sides time the same work.

Variants, alternated round by round in one process:
  generate           model.generate(do_sample=False, use_cache=True)
  decode             tokenflip.run.decode.decode with the default per-step record (top-16,
                     margin, logsumexp, entropy, intervention flag), as every cell runs
  decode-norecord    the same loop with its `StepRecord` replaced by one that keeps only the
                     chosen tokens (recording cannot be turned off in the loop itself)

Targets: decode ≥ 1.0× generate's tokens/s; recording ≤ 3% of the loop's time; host time
per step outside the forward pass ≤ generate's. Beside the end-to-end ratios it reports,
per variant, the time per step outside the model's forward pass (forward hooks), and the
device-to-host synchronisations per step, counted in an untimed run (`_syncs.HostSyncs`:
tensor conversions to the host everywhere, CUDA's sync debug mode on CUDA). A
microbenchmark times the loop's record (`StepRecord.add`, its one transfer spread over the
steps) on real last-step logits, and the same calls on logits 2k wide: the difference is
the statistics' arithmetic, which a GPU runs on the device while the host goes on. The
record's launches per step are counted (`_syncs.device_ops`): eagerly, and as the loop
runs it (on CUDA, its CUDA graph's input copies and one replay).

  .venv/bin/python perf/decode_vs_generate.py [--quick]
  python perf/decode_vs_generate.py --model random-1b --device cuda     # gpu.sh
"""

from __future__ import annotations

import argparse
import contextlib
import time

import _common as c
import torch
from _syncs import HostSyncs, device_ops

from tokenflip.run import decode as decode_mod
from tokenflip.run.decode import decode
from tokenflip.run.step_record import Generation, StepRecord


class TokensOnly(StepRecord):
    """A record of the chosen tokens alone: the loop without its statistics."""

    def add(self, logits, chosen, unfinished, fired):
        if not self.buffers:
            shape = (self.capacity, self.batch)
            self.buffers = {"chosen": torch.empty(shape, dtype=torch.long, device=logits.device),
                            "active": torch.empty(shape, dtype=torch.bool, device=logits.device)}
        self.buffers["chosen"][self.steps].copy_(chosen)
        self.buffers["active"][self.steps].copy_(unfinished)
        self.steps += 1

    def append_to(self, generations, finish=None):
        chosen, active = (self.buffers[name][:self.steps].cpu().numpy() for name in ("chosen", "active"))
        for row, gen in enumerate(generations):
            gen.token_ids.extend(chosen[active[:, row], row].tolist())


@contextlib.contextmanager
def no_recording():
    saved = decode_mod.StepRecord
    decode_mod.StepRecord = TokensOnly
    try:
        yield
    finally:
        decode_mod.StepRecord = saved


def record_cost(model, ids, mask, k: int, device: str, reps: int) -> tuple[float, float]:
    """Seconds per step (on `c.clock`) of the loop's record on this batch's real first-step
    logits, and of the same calls on their first 2k columns (launching the same kernels,
    almost no arithmetic)."""
    with torch.inference_mode():
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=1)
    full = out.logits[:, -1].to(copy=True, dtype=torch.float32)
    narrow = full[:, :2 * k].contiguous()
    chosen = torch.argmax(full, dim=-1)
    unfinished = torch.ones(ids.shape[0], dtype=torch.bool, device=full.device)
    clock = c.clock(device)
    per_step = []
    for logits in (full, narrow):
        times = []
        for _ in range(5):  # median of 5 blocks of `reps` steps
            record, gens = StepRecord(ids.shape[0], reps, k), [Generation() for _ in range(ids.shape[0])]
            record.add(logits, chosen, unfinished, None)  # allocates the buffers, as the loop's first step
            c.sync(device)
            t0 = clock()
            for _ in range(reps - 1):
                record.add(logits, chosen, unfinished, None)
            record.append_to(gens)
            times.append((clock() - t0) / (reps - 1))
        per_step.append(c.median(times))
    return per_step[0], per_step[1]


def record_launches(model, ids, mask, k: int, device: str) -> dict[str, object]:
    """Operations a step of the record issues on this batch's logits (kernel launches on
    CUDA; the same count on a CPU build): eagerly, and as the loop runs it (on CUDA its
    graph's input copies and one replay), with the way it ran."""
    with torch.inference_mode():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                       logits_to_keep=1).logits[:, -1].to(copy=True, dtype=torch.float32)
        chosen = torch.argmax(logits, dim=-1)
        unfinished = torch.ones(ids.shape[0], dtype=torch.bool, device=logits.device)
        counts: dict[str, object] = {}
        saved = StepRecord.GRAPH
        try:
            for name, graph in (("eager", False), ("as run", True)):
                StepRecord.GRAPH = graph
                record = StepRecord(ids.shape[0], 4, k)
                for _ in range(2):  # the first step allocates; the second captures, where it does
                    record.add(logits, chosen, unfinished, None)
                ops = device_ops(lambda: record.add(logits, chosen, unfinished, None))
                counts[name] = sum(ops.values()) + (record.graph is not None)
                counts[f"{name} way"] = record.graph_note
        finally:
            StepRecord.GRAPH = saved
    return counts


def count_syncs(model, variants: dict, device: str, new_tokens: int) -> dict[str, dict[str, float]]:
    """Device-to-host synchronisations per step of each variant, outside and inside the
    forward pass, from one untimed run each."""
    counts = {}
    for name, run in variants.items():
        with HostSyncs(model, device) as syncs:
            run()
        counts[name] = {"outside": syncs.outside / new_tokens, "inside": syncs.inside / new_tokens}
        if syncs.cuda:
            counts[name].update(cuda_outside=syncs.cuda_outside / new_tokens,
                                cuda_inside=syncs.cuda_inside / new_tokens)
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p)
    p.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--new-tokens", type=int, default=None, help="default: 32 on a CPU (16 with --quick), 128 on CUDA")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default: 4, 3 with --quick; 10 on CUDA)")
    p.add_argument("--probe-rounds", type=int, default=3, help="rounds of the untimed pass that times the forward "
                   "pass on CUDA (its hooks synchronise)")
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
            probe = c.interleave(variants, args.probe_rounds, args.device, warmup=0, seed=args.seed,
                                 on_result=keep_result)
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
        record, launch = record_cost(model, ids, mask, args.top_k, args.device, reps=50 if cuda else 20)
        arithmetic = max(record - launch, 0.0)
        syncs = count_syncs(model, variants, args.device, new_tokens)
        launches = record_launches(model, ids, mask, args.top_k, args.device)
        at_equal_forward = (fwd_step + outside["generate"]) / (fwd_step + outside["decode"])
        rec_at_equal_forward = (fwd_step + outside["decode"]) / (fwd_step + outside["decode-norecord"]) - 1
        results[bs] = dict(speed=speed, rec=rec, micro=record / step, same=same, eq=at_equal_forward,
                           rec_eq=rec_at_equal_forward, outside=outside, arithmetic=arithmetic, syncs=syncs,
                           launches=launches)
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
        print(f"  per step, forward pass {1e3 * fwd_step:.2f} ms; host time outside it: generate "
              f"{1e3 * outside['generate']:.3f} ms, decode {1e3 * outside['decode']:.3f} ms, decode-norecord "
              f"{1e3 * outside['decode-norecord']:.3f} ms   target decode <= generate: "
              f"{c.verdict(outside['decode'], outside['generate'])}")
        print(f"  without the statistics' arithmetic ({1e3 * arithmetic:.3f} ms per step; on a GPU the device's): "
              f"decode {1e3 * (outside['decode'] - arithmetic):.3f} ms   target <= generate: "
              f"{c.verdict(outside['decode'] - arithmetic, outside['generate'])}")
        print("  device-to-host synchronisations per step, outside the forward pass (inside it): " + ", ".join(
            f"{name} {n['outside']:.2f} ({n['inside']:.2f})" for name, n in syncs.items()))
        if cuda:
            print("  the same by CUDA's sync debug mode: " + ", ".join(
                f"{name} {n['cuda_outside']:.2f} ({n['cuda_inside']:.2f})" for name, n in syncs.items()))
        print(f"  record launches per step: eager {launches['eager']}, as the loop runs it {launches['as run']} "
              f"({launches['as run way']})")
        print(f"  at equal forward time: decode / generate {at_equal_forward:.3f}x, recording "
              f"{100 * rec_at_equal_forward:+.2f}%")
        print(f"  record alone: {1e3 * record:.3f} ms per step = {100 * record / step:.2f}% of a step "
              f"({1e3 * step:.2f} ms without recording), of which launching its kernels {1e3 * launch:.3f} ms"
              f"   target <= 3%: {c.verdict(record / step, 0.03)}")
    print("\nsummary: " + "; ".join(
        f"bs{bs}: decode/generate {r['speed'][0]:.2f}x end to end, {r['eq']:.3f}x at equal forward time; "
        f"host ms per step outside the forward {1e3 * r['outside']['decode']:.2f} vs generate's "
        f"{1e3 * r['outside']['generate']:.2f} ({1e3 * (r['outside']['decode'] - r['arithmetic']):.2f} without the "
        f"statistics' arithmetic); syncs per step outside the forward {r['syncs']['decode']['outside']:.2f} vs "
        f"{r['syncs']['generate']['outside']:.2f}; recording {100 * (r['rec'][0] - 1):+.1f}% end to end, "
        f"record {100 * r['micro']:.1f}% of a step, {r['launches']['as run']} launches a step "
        f"({r['launches']['eager']} eager)" for bs, r in results.items()))
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0 if all(r["same"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
