"""LM-head interventions: exact arithmetic of each, and the public gated-FP32 wrapper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tokenflip.benchmarks import build_benchmark
from tokenflip.runtime import eos_ids, prompt_token_ids
from tokenflip.decode import decode, left_pad
from tokenflip.interventions import GatedFP32Head, InterventionHead, apply_to_model
from tokenflip.models import load_prepared


def _head(dtype=torch.bfloat16, vocab=50, hidden=16, seed=0):
    torch.manual_seed(seed)
    head = nn.Linear(hidden, vocab, bias=False)
    return head.to(dtype)


def test_ungated_fp32_head_equals_fp32_matmul_exactly():
    head = _head()
    h = torch.randn(3, 1, 16).to(torch.bfloat16)
    out = InterventionHead(head, "fp32_head", gated=False)(h)
    expected = h.float() @ head.weight.float().T
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)
    assert not torch.equal(head(h).float(), expected)  # bf16 really is different
    module = InterventionHead(head, "fp32_head", gated=False)
    # Blockwise upcast: the same dot products, but a block of 7 rows may take another BLAS
    # kernel (another accumulation order) than the whole matrix: equal to a few fp32 ulps.
    blockwise = module._fp32(h[:, -1], chunk=7)
    ulp = torch.finfo(torch.float32).eps * expected[:, -1].abs().max()
    assert (blockwise - expected[:, -1]).abs().max() <= 4 * ulp
    assert torch.equal(module._fp32(h[:, -1]), expected[:, -1])   # one block (the default 4096 rows)


def test_gate_fires_exactly_when_margin_below_tau():
    head = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3, 2))
    # rows: margins 0.0005 (fires), 0.002 (not), exactly tau 0.001 (not: strict <)
    h = torch.tensor([[[1.0, 0.9995]], [[1.0, 0.998]], [[1.0, 0.999]]])
    module = InterventionHead(head, "fp32_head", tau=1e-3)
    margins = (h[:, 0, 0] - h[:, 0, 1]).tolist()
    module(h)
    assert module.fired.tolist() == [m < 1e-3 for m in margins]


def test_quantize_bins_values_within_tau_together_and_ties_to_smaller_id():
    head = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    tau = 0.5
    h = torch.tensor([[[1.10, 1.40, 0.20]]])  # 1.10 and 1.40 share the bin [1.0, 1.5)
    out = InterventionHead(head, "quantize", tau=tau)(h)
    assert out[0, -1].tolist() == [1.0, 1.0, 0.0]
    assert int(torch.argmax(out[0, -1])) == 0  # tie goes to the smaller token id
    h2 = torch.tensor([[[1.49, 1.51, 0.2]]])  # 0.02 apart but across a bin edge
    assert InterventionHead(head, "quantize", tau=tau)(h2)[0, -1].tolist() == [1.0, 1.5, 0.0]


def test_topk_recompute_touches_only_candidates():
    head = _head(vocab=40)
    h = torch.randn(1, 1, 16).to(torch.bfloat16)
    module = InterventionHead(head, "topk_fp32", tau=1e9, top_k=4)  # always fires
    out = module(h)
    base = head(h).float()
    cand = torch.topk(base[0, -1], 4).indices
    exact = (h.float() @ head.weight.float().T)[0, -1]
    assert torch.equal(out[0, -1, cand], torch.floor(exact[cand] / 1e9) * 1e9)
    others = torch.ones(40, dtype=torch.bool)
    others[cand] = False
    assert torch.equal(out[0, -1, others], base[0, -1, others])


def test_bad_tau_is_refused():
    with pytest.raises(ValueError, match="tau must be > 0"):
        InterventionHead(_head(), "fp32_head", tau=0)


def test_public_wrapper_with_generate_matches_our_decode(prepared_models):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    GatedFP32Head.wrap(model, tau=1e-2)
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 2})
    prompts = [prompt_token_ids(tokenizer, bench.messages(i)) for i in bench.items()]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    eos = eos_ids(model, tokenizer)
    ours = decode(model, ids, mask, max_new_tokens=10, use_cache=True, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                         eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    for row, gen in enumerate(ours.generations):
        assert gen.token_ids == ref[row, ids.shape[1]:ids.shape[1] + len(gen.token_ids)].tolist()
    fired = [f for g in ours.generations for f in g.intervened]
    assert len(fired) == 20 and 0 < sum(fired)  # bf16 logits of a random model tie often


def test_global_fp32_computes_in_fp32_from_rounded_weights(prepared_models):
    model, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    rounded = model.get_output_embeddings().weight.detach().clone()
    model = apply_to_model(model, {"kind": "global_fp32"})
    w = model.get_output_embeddings().weight
    assert w.dtype == torch.float32 and torch.equal(w, rounded.float())


def test_temperature_sharpening_cannot_change_greedy_tokens(prepared_models):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 2})
    prompts = [prompt_token_ids(tokenizer, bench.messages(i)) for i in bench.items()]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    kw = dict(max_new_tokens=10, use_cache=True, eos_token_ids=eos_ids(model, tokenizer),
              pad_token_id=tokenizer.pad_token_id)
    base = decode(model, ids, mask, **kw)
    apply_to_model(model, {"kind": "sharpen", "temperature": 0.25})
    sharp = decode(model, ids, mask, **kw)
    assert [g.token_ids for g in sharp.generations] == [g.token_ids for g in base.generations]
    assert sharp.generations[0].top_logits[0][0] == pytest.approx(4 * base.generations[0].top_logits[0][0])
