"""LM-head interventions: exact arithmetic of each, and the public gated-FP32 wrapper."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tokenflip.models.prepare import load_prepared
from tokenflip.run.benchmarks import build_benchmark
from tokenflip.run.decode import decode, left_pad
from tokenflip.run.interventions import GatedFP32Head, InterventionHead, apply_to_model
from tokenflip.run.runtime import eos_ids, prompt_token_ids


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


def _batch(tokenizer, n=2):
    bench = build_benchmark("a", {"kind": "arithmetic", "n": n})
    return left_pad([prompt_token_ids(tokenizer, bench.messages(i)) for i in bench.items()], tokenizer.pad_token_id)


def test_round_to_fp8_by_hand():
    """Row [1, 0.5, 0.3], E4M3 (largest finite 448): the power-of-two scale that fits 1 is
    2⁻⁸ (2⁻⁹ would put it at 512); 1 and 0.5 become 256 and 128, exact; 0.3 becomes 76.8,
    whose nearest E4M3 value is 80 (steps of 8 between 64 and 128), so it comes back as
    80/256. Row [-2, 0, 1] scales by 2⁻⁷ to -256, 0, 128: exact."""
    from tokenflip.run.model_edits import round_to_fp8

    w = torch.tensor([[1.0, 0.5, 0.3], [-2.0, 0.0, 1.0]])
    out = round_to_fp8(w, "e4m3")
    assert out.tolist() == [[1.0, 0.5, 80 / 256], [-2.0, 0.0, 1.0]]
    assert out.dtype == w.dtype


def test_fp8_codes_are_the_same_in_bf16_and_fp16_cells():
    """The same weights held in bf16 and in fp16 round to the same FP8 values, exactly
    representable in both: the two cells then differ in arithmetic only."""
    from tokenflip.run.model_edits import round_to_fp8

    torch.manual_seed(0)
    w = (torch.randn(64, 256) * 0.05).to(torch.bfloat16)
    bf16, fp16 = round_to_fp8(w, "e4m3"), round_to_fp8(w.to(torch.float16), "e4m3")
    assert torch.equal(bf16.float(), fp16.float())
    assert not torch.equal(bf16.float(), w.float())


def test_fp8_weights_round_the_body_or_everything_and_keep_a_tied_embedding(prepared_models):
    from tokenflip.run.model_edits import round_to_fp8

    base, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    body, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    whole, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    apply_to_model(body, {"kind": "fp8_weights", "scope": "body", "format": "e4m3"})
    apply_to_model(whole, {"kind": "fp8_weights", "scope": "all", "format": "e5m2"})
    q_base = base.get_decoder().layers[0].self_attn.q_proj.weight
    assert torch.equal(body.get_decoder().layers[0].self_attn.q_proj.weight, round_to_fp8(q_base, "e4m3"))
    assert not torch.equal(body.get_decoder().layers[0].self_attn.q_proj.weight, q_base)
    assert torch.equal(body.get_output_embeddings().weight, base.get_output_embeddings().weight)
    head = base.get_output_embeddings().weight
    assert torch.equal(whole.get_output_embeddings().weight, round_to_fp8(head, "e5m2"))
    # The embedding is never rounded, tied to the head or not.
    assert torch.equal(whole.get_input_embeddings().weight, base.get_input_embeddings().weight)


def test_fp32_scope_hands_the_head_an_unrounded_fp32_hidden_state(prepared_models):
    """scope last_layer on a bf16 model: the last layer keeps fp32 keys and values, the head
    receives fp32 that bf16 cannot hold; in an fp32 model the scope changes nothing."""
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    apply_to_model(model, {"kind": "fp32_head", "gated": False, "tau": 1e-3, "scope": "last_layer"})
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids, mask = _batch(tokenizer)
    kw = dict(max_new_tokens=6, use_cache=True, eos_token_ids=eos_ids(model, tokenizer),
              pad_token_id=tokenizer.pad_token_id)
    decode(model, ids, mask, **kw)
    assert all(h.dtype == torch.float32 for h in seen)
    assert any(not torch.equal(h, h.to(torch.bfloat16).float()) for h in seen)
    from tokenflip.run.decode import _new_cache
    cache = _new_cache(model)
    model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    assert cache.layers[-1].keys.dtype == torch.float32 and cache.layers[0].keys.dtype == torch.bfloat16

    fp32, _, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    plain = decode(fp32, ids, mask, **kw)
    apply_to_model(fp32, {"kind": "fp32_head", "gated": False, "tau": 1e-3, "scope": "last_layer"})
    scoped = decode(fp32, ids, mask, **kw)
    for a, b in zip(plain.generations, scoped.generations):
        assert a.token_ids == b.token_ids and all(map(torch.equal, map(torch.from_numpy, a.top_logits),
                                                      map(torch.from_numpy, b.top_logits)))


def test_consensus_decodes_the_same_tokens_whatever_the_cell_precision(prepared_models):
    """A bf16 cell and an fp16 cell with consensus decoding give bitwise the same logits,
    the mean of the two precisions' own logits, at twice the forward passes."""
    directory = prepared_models("llama")

    def load(precision):
        return load_prepared(directory, precision, "cpu")[0]

    tokenizer = load_prepared(directory, "bf16", "cpu")[1]
    ids, mask = _batch(tokenizer, 3)
    kw = dict(max_new_tokens=8, use_cache=True, eos_token_ids=eos_ids(load("bf16"), tokenizer),
              pad_token_id=tokenizer.pad_token_id)
    spec = {"kind": "consensus", "precisions": ["bf16", "fp16"]}
    runs = {p: decode(apply_to_model(load(p), spec, load), ids, mask, **kw) for p in ("bf16", "fp16")}
    for a, b in zip(runs["bf16"].generations, runs["fp16"].generations):
        assert a.token_ids == b.token_ids
        assert all(torch.equal(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(a.top_logits, b.top_logits))
    with torch.no_grad():
        plain = {p: load(p)(input_ids=ids, attention_mask=mask).logits[:, -1].float() for p in ("bf16", "fp16")}
    first = (plain["bf16"] + plain["fp16"]) / 2
    for row, gen in enumerate(runs["bf16"].generations):
        assert gen.top_logits[0][0] == pytest.approx(float(first[row].max()), abs=1e-6)
    # Without consensus the two precisions do not agree everywhere on this model.
    alone = {p: decode(load(p), ids, mask, **kw) for p in ("bf16", "fp16")}
    assert any(not torch.equal(torch.from_numpy(x), torch.from_numpy(y))
               for a, b in zip(alone["bf16"].generations, alone["fp16"].generations)
               for x, y in zip(a.top_logits, b.top_logits))


def test_compose_applies_each_step_in_order(prepared_models):
    from tokenflip.run.interventions import weights_precision
    from tokenflip.run.model_edits import round_to_fp8

    model, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    head = model.get_output_embeddings().weight.detach().clone()
    spec = {"kind": "compose", "of": [{"kind": "fp8_weights", "scope": "all", "format": "e4m3"},
                                      {"kind": "fp32_head", "tau": 1e-3, "gated": True}]}
    apply_to_model(model, spec, lambda p: None)
    wrapped = model.get_output_embeddings()
    assert isinstance(wrapped, InterventionHead) and torch.equal(wrapped.head.weight, round_to_fp8(head, "e4m3"))
    assert weights_precision(spec, "bf16") == "bf16"
    assert weights_precision({"kind": "compose", "of": [{"kind": "fp32_oracle"}, {"kind": "sharpen"}]}, "bf16") == "fp32"
    with pytest.raises(ValueError, match="pass `load`"):
        apply_to_model(model, spec)


def test_consensus_cells_of_two_precisions_agree_exactly_end_to_end(prepared_models, tmp_path):
    """From the config through run_cell and compare: the bf16 and fp16 cells with consensus
    decoding form a pair with no divergence; without it, the same pair diverges."""
    from conftest import tiny_study
    from tokenflip.analysis.compare import compare_files
    from tokenflip.core.layout import RunLayout
    from tokenflip.run.cell import run_cell
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import cell_job, expand_cells, expand_pairs

    study = tiny_study()
    study.update(benchmarks={"a": {"kind": "arithmetic", "n": 6, "max_new_tokens": 16}},
                 interventions={"none": {"kind": "none"}, "consensus": {"kind": "consensus"}},
                 grids=[{"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1],
                         "intervention": ["none", "consensus"]}],
                 comparisons=[{"axis": "precision", "a": "bf16", "b": "fp16"}])
    config = cfg.validate(study, check_data=False)
    layout = RunLayout(config["run"], root=str(tmp_path))
    cells = expand_cells(config)
    for cell in cells:
        run_cell(cell_job(config, cell), prepared_models("llama"), layout.cell(cell.id), progress=False)
    diverged = {}
    for pair in expand_pairs(config, cells):
        meta = compare_files(pair, layout.cell(pair.a.id), layout.cell(pair.b.id), layout.pair(pair.id))
        diverged[pair.a.intervention] = meta["summary"]["n_diverged"]
    assert diverged["consensus"] == 0 and diverged["none"] > 0


def test_fp32_matmul_multiplies_in_fp32_and_rounds_back(prepared_models):
    """Each linear layer's output is the fp32 product of its 16-bit input and weights,
    rounded to bf16, bit for bit, and the model decodes with it. (Whether that differs from
    the native bf16 product depends on the kernels: on GPUs 16-bit reductions are allowed.)"""
    from torch.nn import functional as F

    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    native = decode(model, *_batch(tokenizer), max_new_tokens=6, use_cache=True,
                    eos_token_ids=eos_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id)
    apply_to_model(model, {"kind": "fp32_matmul"})
    q = model.get_decoder().layers[0].self_attn.q_proj
    x = torch.randn(3, q.in_features).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(q(x), F.linear(x.float(), q.weight.float()).to(torch.bfloat16))
        assert q(x).dtype == torch.bfloat16
    ours = decode(model, *_batch(tokenizer), max_new_tokens=6, use_cache=True,
                  eos_token_ids=eos_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id)
    # The head's output is rounded back too: every recorded logit is a bfloat16 value.
    logits = torch.from_numpy(np.concatenate([np.stack(g.top_logits) for g in ours.generations]))
    assert torch.equal(logits, logits.to(torch.bfloat16).float())
    assert [len(g.token_ids) for g in ours.generations] == [len(g.token_ids) for g in native.generations]


@pytest.mark.parametrize("steps, needle", [
    ([{"kind": "fp32_head"}, {"kind": "consensus"}], "'consensus' can only be the first step"),
    ([{"kind": "quantize"}, {"kind": "fp32_head"}], "at most one LM-head intervention per entry"),
    ([{"kind": "consensus"}, {"kind": "fp32_oracle"}], "'fp32_oracle' would have no effect"),
    ([{"kind": "fp32_head"}, {"kind": "fp8_weights"}], "'fp8_weights' must come before 'fp32_head'"),
])
def test_a_composition_that_cannot_mean_what_it_says_is_refused_before_any_job(steps, needle):
    from conftest import tiny_study
    from tokenflip.study import config as cfg

    study = tiny_study()
    study["interventions"] = {"none": {"kind": "none"}, "both": {"kind": "compose", "of": steps}}
    with pytest.raises(cfg.ConfigError, match=needle) as err:
        cfg.validate(study, source="study.yaml", check_data=False)
    assert "study.yaml: interventions.both.of" in str(err.value)


def test_steps_after_consensus_apply_to_every_precision(prepared_models):
    directory = prepared_models("llama")

    def load(precision):
        return load_prepared(directory, precision, "cpu")[0]

    spec = {"kind": "compose", "of": [{"kind": "consensus", "precisions": ["bf16", "fp16"]},
                                      {"kind": "fp32_head", "tau": 1e-3, "gated": True}]}
    model = apply_to_model(load("bf16"), spec, load)
    assert [type(copy.get_output_embeddings()) for copy in model.copies] == [InterventionHead] * 2
    assert [copy.dtype for copy in model.copies] == [torch.bfloat16, torch.float16]
    # A step counts as intervened when either copy's gate opened.
    tokenizer = load_prepared(directory, "bf16", "cpu")[1]
    out = decode(model, *_batch(tokenizer), max_new_tokens=10, use_cache=True, eos_token_ids=[],
                 pad_token_id=tokenizer.pad_token_id)
    gates = [g.intervened for g in out.generations]
    assert any(any(row) for row in gates)
    ones = [model.copies[i].get_output_embeddings().fired for i in range(2)]
    assert model.fired().tolist() == (ones[0] | ones[1]).tolist()


def test_mixture_of_experts_weights_are_covered_or_refused(prepared_models):
    """OLMoE keeps its experts as bare parameters: fp8_weights rounds them too, and
    fp32_matmul, which covers linear layers only, refuses the model instead of running part
    of its products in 16 bit."""
    from tokenflip.run.model_edits import round_to_fp8

    base, _, _ = load_prepared(prepared_models("olmoe"), "bf16", "cpu")
    model, _, _ = load_prepared(prepared_models("olmoe"), "bf16", "cpu")
    apply_to_model(model, {"kind": "fp8_weights", "scope": "body", "format": "e4m3"})
    experts, before = model.get_decoder().layers[1].mlp.experts, base.get_decoder().layers[1].mlp.experts
    for name in ("gate_up_proj", "down_proj"):
        assert torch.equal(getattr(experts, name), round_to_fp8(getattr(before, name), "e4m3"))
    with pytest.raises(ValueError, match=r"covers linear layers only.*layers\.0\.mlp\.experts"):
        apply_to_model(base, {"kind": "fp32_matmul"})
