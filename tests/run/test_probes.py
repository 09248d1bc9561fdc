"""KV-cache probe on tiny models: real values, not shapes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tokenflip.models.prepare import load_prepared
from tokenflip.run.benchmarks import build_benchmark
from tokenflip.run.probes.kv_cache import patch_steps, probe_prompt
from tokenflip.run.probes.replay import kl_divergence, replay
from tokenflip.run.runtime import eos_ids, prompt_token_ids


def _probe(prepared_models, arch, precision, steps=20, patches=2):
    model, tokenizer, _ = load_prepared(prepared_models(arch), precision, "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    result = probe_prompt(model, prompt, steps, eos_ids(model, tokenizer), tokenizer.pad_token_id, patches)
    return {name: pd.DataFrame(rows) for name, rows in result.items()}, model, tokenizer, prompt


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_fp32_cache_on_and_off_agree_to_rounding(prepared_models, arch):
    r, *_ = _probe(prepared_models, arch, "fp32", patches=0)
    steps = r["steps"]
    assert len(steps) == 20
    assert steps["flip"].sum() == 0
    assert steps["max_abs_dlogit"].max() < 1e-4
    assert steps["kl"].max() < 1e-10
    assert r["layers"]["layer"].nunique() == 2


def test_bf16_kv_cache_is_the_causal_state(prepared_models):
    r, *_ = _probe(prepared_models, "llama", "bf16")
    steps, patching = r["steps"], r["patching"]
    assert steps["kl"].max() > 1e-9  # bf16 cache on and off really differ on this model
    by = patching.pivot(index="step", columns="patch", values="kl")
    assert len(by) == 2 and (by["none"] > 0).all()
    # The unpatched step run alone from its own cache is the replay's step, bit for bit.
    # (KL summed over one row instead of many: equal to float64 rounding.)
    assert list(by["none"]) == pytest.approx([steps.loc[t, "kl"] for t in by.index], rel=1e-12)
    none = patching[patching["patch"] == "none"]
    assert list(none["max_abs_dlogit"]) == [steps.loc[t, "max_abs_dlogit"] for t in none["step"]]
    # Cache-off's own keys and values make the cache-on step equal to cache-off's exactly:
    # the whole cache, and (layer 0 computes the same in both) layer 1's alone.
    for patch in ("kv cache", "kv layer 1", "residual layer 1"):
        rows = patching[patching["patch"] == patch]
        assert (rows["max_abs_dlogit"] == 0).all() and (rows["kl"] == 0).all() and (rows["kl_recovered"] == 1).all()
    # The residual stream at the current position (embedding and layer 0, which agree in both
    # runs) leaves the difference in place: the last layer still attends over cache-on keys.
    for patch in ("residual stream", "residual layer 0", "kv layer 0"):
        assert list(by[patch]) == list(by["none"])
        assert (patching.loc[patching["patch"] == patch, "kl_recovered"] == 0).all()
    # Layer drift: the embedding-fed first layer agrees exactly; the difference appears after.
    by_layer = r["layers"].groupby("layer")["l2"].mean()
    assert by_layer[0] == 0 and by_layer[1] > 0


def test_cache_off_keys_and_values_past_a_sliding_window(prepared_models):
    """Gemma-2's tiny model slides a 16-position window on layer 0: past it, cache-off's keys
    and values cut before the current position still match the cache-on cache position for
    position, so the whole-cache patch makes the step cache-off's."""
    from tokenflip.run.probes.replay import cache_before, recomputed_cache, step_once

    model, tokenizer, _ = load_prepared(prepared_models("gemma2"), "bf16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    kw = dict(eos_token_ids=[], pad_token_id=tokenizer.pad_token_id)
    on = replay(model, prompt, use_cache=True, max_new_tokens=12, **kw)
    off = replay(model, prompt, use_cache=False, max_new_tokens=12, tokens=on.tokens, **kw)
    window = cache_before(model, prompt, on.tokens, 1).layers[0].sliding_window
    assert len(prompt) > window  # past the window from the first step
    for t in (1, 6, 11):
        own, cut = cache_before(model, prompt, on.tokens, t), recomputed_cache(model, prompt, on.tokens, t)
        for mine, theirs in zip(own.layers, cut.layers):
            assert mine.keys.shape == theirs.keys.shape
        assert torch.equal(step_once(model, prompt, on.tokens, t, cut).logits[0], off.logits[t])


def test_one_step_from_a_cache_is_that_step_of_the_replay(prepared_models):
    """What the probes' patches build on: step t run alone from the cache a cache-on run
    holds before t gives that run's logits and activations bit for bit, at every step."""
    from tokenflip.run.probes.replay import cache_before, step_once

    model, tokenizer, _ = load_prepared(prepared_models("mistral"), "bf16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    run = replay(model, prompt, use_cache=True, max_new_tokens=10, eos_token_ids=eos_ids(model, tokenizer),
                 pad_token_id=tokenizer.pad_token_id)
    for t in range(len(run.tokens)):
        cache = cache_before(model, prompt, run.tokens, t)
        one = step_once(model, prompt, run.tokens, t, cache)
        assert torch.equal(one.logits[0], run.logits[t])
        assert torch.equal(one.layer_outputs[0], run.layer_outputs[t])
        assert torch.equal(one.embedding[0], run.embedding[t]) and torch.equal(one.normed[0], run.normed[t])
        if cache is not None:  # the cache handed in is copied, never extended
            assert cache.get_seq_length() == len(prompt) + t - 1


def test_kl_recovered_share():
    from tokenflip.run.probes.kv_cache import kl_recovered

    assert kl_recovered(0.25, 1.0) == 0.75
    assert kl_recovered(0.0, 2.0) == 1.0
    assert kl_recovered(3.0, 1.5) == -1.0  # a patch can make it worse
    assert np.isnan(kl_recovered(0.0, 0.0))


def test_replay_of_own_trajectory_is_bitwise_free_generation(prepared_models):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    kw = dict(eos_token_ids=eos_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id)
    free = replay(model, prompt, use_cache=False, max_new_tokens=12, **kw)
    forced = replay(model, prompt, use_cache=False, max_new_tokens=12, tokens=free.tokens, **kw)
    assert forced.tokens == free.tokens
    assert torch.equal(forced.logits, free.logits)
    assert torch.equal(forced.layer_outputs, free.layer_outputs)


def test_kl_and_patch_step_choice():
    p = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert kl_divergence(p, p).tolist() == [0.0, 0.0]
    q = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    pr = torch.softmax(p[1].double(), -1)
    expected = float((pr * (pr.log() - torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)))).sum())
    assert kl_divergence(p, q)[1].item() == pytest.approx(expected, rel=1e-12)
    import numpy as np
    kl = np.array([9.0, 1.0, 5.0, 0.0, 3.0])
    flips = np.array([False, False, False, False, True])
    assert patch_steps(kl, flips, 2) == [2, 4]  # first flip, then the largest KL after step 0
    assert patch_steps(kl, flips, 0) == []


def test_precision_probe_finds_and_explains_flips(prepared_models):
    from tokenflip.run.probes.precision import probe_prompt as precision_probe

    model_a, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    model_b, _, _ = load_prepared(prepared_models("llama"), "fp16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 8})
    eos, pad = eos_ids(model_a, tokenizer), tokenizer.pad_token_id
    flipped = 0
    for item in bench.items():
        prompt = prompt_token_ids(tokenizer, bench.messages(item))
        r = {k: pd.DataFrame(v) for k, v in precision_probe(model_a, model_b, prompt, 24, eos, pad, 1).items()}
        steps = r["steps"]
        assert (steps["kl"] >= 0).all() and (steps["kl"] > 0).any()  # bf16 and fp16 always differ somewhere
        if not steps["flip"].any():
            assert r["grafting"].empty  # nothing to graft; the lens traces mid-generation
            agreed = r["lens"][r["lens"]["group"] == "agreed"]
            assert set(agreed["step"]) == {len(steps) // 2} and len(agreed) == 2
            continue
        flipped += 1
        t = int(steps.index[steps["flip"]][0])
        graft = r["grafting"]
        sites = ["embedding", "layer 0", "layer 1", "final norm"] + (["kv cache"] if t else [])
        for direction in ("b→a", "a→b"):
            assert list(graft.loc[graft["direction"] == direction, "graft"]) == sites
        lens = r["lens"]
        assert list(lens["group"]) == ["first_token"] * 2 + ["diverged"] * 2 and list(lens["layer"]) == [0, 1, 0, 1]
        assert list(lens["step"]) == [0, 0, t, t]
        # The final layer's lens is the model's own readout: its margin is the step's.
        assert lens["margin_a"].iloc[-1] == pytest.approx(steps.loc[t, "margin_a"], abs=1e-6)
        assert lens["margin_a"].iloc[1] == pytest.approx(steps.loc[0, "margin_a"], abs=1e-6)
    assert flipped >= 1  # this tiny model flips between bf16 and fp16 on some of these prompts


def test_precision_probe_of_a_precision_against_itself_is_exactly_zero(prepared_models):
    from tokenflip.run.probes.precision import probe_prompt as precision_probe

    model_a, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    model_b, _, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    r = precision_probe(model_a, model_b, prompt, 16, eos_ids(model_a, tokenizer), tokenizer.pad_token_id, 3)
    assert all(s["kl"] == 0 and not s["flip"] for s in r["steps"])
    assert all(row["l2"] == 0 for row in r["layers"])


def _last_mlp_in_fp8(model):
    """The model with its last decoder layer's MLP weights rounded to fp8 (e4m3), everything
    else untouched: a precision difference confined to that one layer's MLP."""
    from tokenflip.run.probes.replay import decoder_layers

    with torch.no_grad():
        for weight in decoder_layers(model)[-1].mlp.parameters():
            weight.copy_(weight.to(torch.float8_e4m3fn).float())
    return model


def test_grafting_the_last_layer_from_b_fixes_every_flip(prepared_models):
    """When a and b differ only inside the last layer (fp32 everywhere, b's last MLP in fp8),
    b's last-layer output grafted into a goes through the same final norm and LM head as in
    b, so a's logits at the flip step become b's bit for bit and the flip is fixed. Grafting
    layer 0 changes nothing (both compute it identically), so it fixes nothing."""
    from tokenflip.run.probes.precision import probe_prompt as precision_probe
    
    model_a, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    model_b = _last_mlp_in_fp8(load_prepared(prepared_models("llama"), "fp32", "cpu")[0])
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 8})
    kw = dict(eos_token_ids=eos_ids(model_a, tokenizer), pad_token_id=tokenizer.pad_token_id)
    flipped = 0
    for item in bench.items():
        prompt = prompt_token_ids(tokenizer, bench.messages(item))
        r = {k: pd.DataFrame(v) for k, v in precision_probe(model_a, model_b, prompt, 24, kw["eos_token_ids"],
                                                            kw["pad_token_id"], 1).items()}
        layers = r["layers"]
        assert (layers.loc[layers["layer"] == 0, "l2"] == 0).all()
        assert (layers.loc[layers["layer"] == 1, "l2"] > 0).all()
        steps = r["steps"]
        if not steps["flip"].any():
            continue
        flipped += 1
        t = int(steps.index[steps["flip"]][0])
        graft = r["grafting"]
        for direction in ("b→a", "a→b"):
            fixed = dict(zip(*graft.loc[graft["direction"] == direction, ["graft", "fixed"]].T.values))
            # The last layer's output and the final norm's carry the whole difference; the
            # embedding, layer 0 and the KV cache (the MLP feeds no key or value) none of it.
            assert fixed == {"embedding": False, "layer 0": False, "layer 1": True, "final norm": True,
                             **({"kv cache": False} if t else {})}, direction
        # The heads are the same (fp32 both): the whole perturbation is the body's.
        assert (steps["sigma_z_head"] == 0).all() and (steps["directional_head"] == 0).all()
        assert np.allclose(steps["sigma_z_body"], steps["sigma_z"], rtol=1e-4, atol=1e-7)
        assert np.allclose(steps["directional_body"], steps["directional"], rtol=1e-9, atol=1e-9)

        # The same grafts by hand: the logits after the graft are exactly b's (or a's own).
        a = replay(model_a, prompt, use_cache=True, max_new_tokens=24, **kw)
        b = replay(model_b, prompt, use_cache=True, max_new_tokens=24, tokens=a.tokens, **kw)
        assert a.logits[t].argmax() != b.logits[t].argmax()
        upto = a.tokens[: t + 1]
        for patch, expected in (({1: b.layer_outputs[t, 1]}, b.logits[t]),      # the last layer
                                (dict(enumerate(b.layer_outputs[t])), b.logits[t]),   # every layer at once
                                ({0: b.layer_outputs[t, 0]}, a.logits[t])):      # layer 0: a no-op
            grafted = replay(model_a, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                             patches={t: patch}, **kw)
            assert torch.equal(grafted.logits[t], expected)
    assert flipped >= 1  # rounding one MLP to fp8 flips this tiny model on some of these prompts


def test_a_perturbation_confined_to_the_lm_head_is_all_head(prepared_models):
    """b is a (fp32) with an untied copy of its LM head rounded to bf16: the hidden states
    are the same, so the body's part of σz is exactly 0 and the head's is all of σz."""
    from tokenflip.run.probes.precision import probe_prompt as precision_probe

    model_a, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    model_b, _, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    head = model_b.get_output_embeddings()
    rounded = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    with torch.no_grad():
        rounded.weight.copy_(head.weight.to(torch.bfloat16).float())
    model_b.set_output_embeddings(rounded)
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    r = precision_probe(model_a, model_b, prompt, 12, eos_ids(model_a, tokenizer), tokenizer.pad_token_id, 0)
    steps = pd.DataFrame(r["steps"])
    assert (pd.DataFrame(r["layers"])["l2"] == 0).all()
    assert (steps["sigma_z_body"] == 0).all() and (steps["sigma_z_head"] > 0).all()
    assert np.allclose(steps["sigma_z_head"], steps["sigma_z"], rtol=1e-4)
    # The same split of the top-2 directional perturbation (App. XII): all of it the head's.
    assert (steps["directional_body"] == 0).all()
    assert np.allclose(steps["directional_head"], steps["directional"], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_head_read_of_the_final_norm_output_is_the_models_own_logits(prepared_models, arch, precision):
    """What the σz split and the lens stand on: the LM head applied to the recorded final-norm
    outputs gives the decode loop's logits bit for bit, Gemma-2's 16-bit soft-capping
    included, so the head's and the body's parts add up to the measured difference."""
    from tokenflip.run.probes.replay import head_logits

    model, tokenizer, _ = load_prepared(prepared_models(arch), precision, "cpu")
    bench = build_benchmark("a", {"kind": "arithmetic", "n": 1})
    prompt = prompt_token_ids(tokenizer, bench.messages(bench.items()[0]))
    run = replay(model, prompt, use_cache=True, max_new_tokens=8, eos_token_ids=[],
                 pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(head_logits(model, run.normed), run.logits)
