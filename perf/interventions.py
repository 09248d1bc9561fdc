"""Wall-time overhead of the LM-head interventions at batch size 1 in bf16.

Variants, each its own copy of the same bf16 model, alternated round by round in one
process and decoded with tokenflip's loop (recording top-16, as a cell does):
  none         no intervention
  C-gated      fp32_head, gated: the head recomputed in fp32 when the top-2 margin < tau
  C-ungated    fp32_head at every step
  global-fp32  bf16-rounded weights, fp32 compute everywhere (model.float())

Target (issue "Performance"): C-gated ≤ 3% over none (the paper reports < 4%). The gate's
trigger rate (fraction of steps where it fired) is reported beside it, and a
microbenchmark times the head alone (bf16 head vs the fp32 recomputation) to explain the
ungated cost. Every run generates exactly --new-tokens tokens per prompt (no EOS), so the
variants time the same number of steps even where their tokens differ.

  .venv/bin/python perf/interventions.py [--quick]
  python perf/interventions.py --model random-1b --device cuda     # gpu.sh
"""

from __future__ import annotations

import argparse
import copy
import time

import _common as c
import torch

from tokenflip.run.decode import decode
from tokenflip.run.interventions import InterventionHead, apply_to_model

VARIANTS = {
    "none": {"kind": "none"},
    "C-gated": {"kind": "fp32_head", "tau": 1e-3, "gated": True},
    "C-ungated": {"kind": "fp32_head", "gated": False},
    "global-fp32": {"kind": "global_fp32"},
}


def head_cost(model, device: str, reps: int) -> dict[str, float]:
    """Seconds per call (on `c.clock`) of the model's own 16-bit head and of fp32
    recomputations of it on one hidden vector (batch 1, last position): as implemented
    (the whole weight upcast on every call), upcast in chunks of rows, and from a
    persistent fp32 copy of the weight. Also whether the alternatives are bitwise equal
    to the implementation here."""
    head = model.get_output_embeddings()
    head = head.head if isinstance(head, InterventionHead) else head
    fp32 = InterventionHead(head, "fp32_head", gated=False)
    hidden = torch.randn(1, head.in_features, dtype=head.weight.dtype, device=head.weight.device)
    weight32 = head.weight.float()

    def chunked(rows: int = 4096) -> torch.Tensor:
        h = hidden.float()
        return torch.cat([h @ head.weight[i:i + rows].float().T for i in range(0, head.weight.shape[0], rows)],
                         dim=-1)

    fns = {"16-bit head": lambda: head(hidden), "fp32, full upcast (implemented)": lambda: fp32._fp32(hidden),
           "fp32, upcast in 4096-row chunks": chunked, "fp32, persistent fp32 weight": lambda: hidden.float() @ weight32.T}
    out = {}
    with torch.inference_mode():
        ref = fp32._fp32(hidden)
        equal = {"fp32, upcast in 4096-row chunks": torch.equal(chunked(), ref),
                 "fp32, persistent fp32 weight": torch.equal(hidden.float() @ weight32.T, ref)}
        for name, fn in fns.items():
            fn()
            blocks, clock = [], c.clock(device)
            for _ in range(5):
                c.sync(device)
                t0 = clock()
                for _ in range(reps):
                    fn()
                c.sync(device)
                blocks.append((clock() - t0) / reps)
            out[name] = c.median(blocks)
    del weight32
    return out, equal


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p, default_precision="bf16")
    p.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts, one per round in turn, each at "
                   "batch size 1 (default 4)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 32 (16 with --quick); 128 on CUDA")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 8, 4 with --quick; 12 on CUDA)")
    p.add_argument("--tau", type=float, default=1e-3)
    args = p.parse_args(argv)
    c.setup(args)
    cuda = args.device == "cuda"
    new_tokens = args.new_tokens or (128 if cuda else 16 if args.quick else 32)
    rounds = args.rounds or (12 if cuda and not args.quick else 6 if cuda else 4 if args.quick else 8)
    VARIANTS["C-gated"]["tau"] = args.tau
    c.header("LM-head intervention overhead (batch size 1)", args, args.device)
    t_start = time.perf_counter()

    base, tokenizer = c.load_model(args, args.precision)
    pad = c.pad_id(base, tokenizer)
    models, heads = {}, {}
    for name, spec in VARIANTS.items():
        m = copy.deepcopy(base) if name != "none" else base
        models[name] = apply_to_model(m, spec).eval()
        heads[name] = c.ModuleClock(models[name].get_output_embeddings(), args.device)
    ids, mask = c.batch(tokenizer, base, args.prompts, args.seed)
    batches = [(ids[i:i + 1, mask[i].bool()], mask[i:i + 1, mask[i].bool()]) for i in range(args.prompts)]
    print(f"model: {args.model} {args.precision} ({sum(q.numel() for q in base.parameters()) / 1e6:.0f}M "
          f"parameters); per round one prompt (of {args.prompts}, in turn) x {new_tokens} new tokens per variant, "
          f"{rounds} rounds (+1 warm-up); tau {args.tau}")
    current = {"prompt": 0}

    def runner(name):
        model = models[name]

        def run():
            heads[name].take()
            b_ids, b_mask = batches[current["prompt"] % len(batches)]
            res = decode(model, b_ids, b_mask, max_new_tokens=new_tokens, use_cache=True,
                         eos_token_ids=c.NO_EOS, pad_token_id=pad, record_top_k=16)
            return res.generations, heads[name].take()[0]
        return run

    fired: dict[str, list[bool]] = {name: [] for name in VARIANTS}
    tokens: dict[str, dict[int, list]] = {name: {} for name in VARIANTS}
    head_time: dict[str, list[float]] = {name: [] for name in VARIANTS}
    seen: dict[str, int] = {name: 0 for name in VARIANTS}

    def keep(name, out):
        gens, head_seconds = out
        fired[name].extend(f for g in gens for f in g.intervened)
        tokens[name].setdefault(current["prompt"] % len(batches), [g.token_ids for g in gens])
        head_time[name].append(head_seconds)
        seen[name] += 1
        if all(v == seen[name] for v in seen.values()):  # every variant ran this round
            current["prompt"] += 1

    variants = {name: runner(name) for name in VARIANTS}
    times = c.interleave(variants, rounds, args.device, seed=args.seed, on_result=keep)
    if cuda:  # head times need synchronising hooks: a separate, untimed pass
        for name in VARIANTS:
            head_time[name].clear()
            heads[name].active = True
        probe = c.interleave(variants, 4, args.device, warmup=0, seed=args.seed, on_result=keep)
        for name in VARIANTS:
            heads[name].active = False
    else:
        probe = times
    steps = new_tokens
    print()
    for name in times.wall:
        print("  " + times.line(name, steps))
    none_step = c.median(probe.primary["none"]) / steps
    print(f"  overheads on {times.primary_name}: total over all rounds (= over the prompts); median of per-round "
          f"ratios with IQR in brackets; wall in parentheses; 'head' = the intervention's own cost, measured "
          f"inside the lm_head, relative to a step of none:")
    results = {}
    for name in ("C-gated", "C-ungated", "global-fp32"):
        r = times.ratio(name, "none")
        w = times.wall_ratio(name, "none")
        total = times.sum_ratio(name, "none")
        head_extra = (sum(head_time[name]) - sum(head_time["none"])) / sum(probe.primary["none"])
        results[name] = (total, head_extra)
        rate = sum(fired[name]) / len(fired[name]) if fired[name] else 0.0
        same = sum(tokens[name][i] == tokens["none"][i] for i in tokens["none"])
        target = f"   target <= 3%: {c.verdict(total - 1, 0.03)}" if name == "C-gated" else ""
        head_note = f", head {100 * head_extra:+.2f}%" if name != "global-fp32" else ""
        print(f"  {name:12s} {100 * (total - 1):+7.2f}%; median {100 * (r[0] - 1):+.2f}% [{100 * (r[1] - 1):+.2f}% "
              f"to {100 * (r[2] - 1):+.2f}%] ({100 * (w[0] - 1):+.2f}%){head_note}; fired on {100 * rate:.2f}% of "
              f"steps; {same}/{len(tokens['none'])} prompts with the tokens of none{target}")
    costs, equal = head_cost(base, args.device, reps=200 if cuda else 10)
    print(f"\n  the head alone, per call (batch 1), against a {1e3 * none_step:.2f} ms step without intervention:")
    for name, seconds in costs.items():
        eq = f", bitwise equal to the implemented one: {equal[name]}" if name in equal else ""
        print(f"    {name:34s} {1e3 * seconds:8.3f} ms = {100 * seconds / none_step:6.1f}% of a step{eq}")
    rate = sum(fired["C-gated"]) / max(1, len(fired["C-gated"]))
    expected = rate * costs["fp32, full upcast (implemented)"] / none_step
    print(f"  trigger rate x fp32 recomputation / step = {100 * expected:.2f}% expected from the recomputations alone")
    print(f"\nsummary: C-gated {100 * (results['C-gated'][0] - 1):+.1f}% end to end "
          f"({100 * results['C-gated'][1]:+.2f}% measured in the head; trigger rate {100 * rate:.1f}%), "
          f"C-ungated {100 * (results['C-ungated'][0] - 1):+.1f}%, "
          f"global-fp32 {100 * (results['global-fp32'][0] - 1):+.1f}%")
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
