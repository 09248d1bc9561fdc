"""KV-cache probe on tiny models: real values, not shapes."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tokenflip.benchmarks import build_benchmark
from tokenflip.runtime import eos_ids, prompt_token_ids
from tokenflip.models import load_prepared
from tokenflip.probes.kv_cache import patch_steps, probe_prompt
from tokenflip.probes.replay import kl_divergence
from tokenflip.probes.replay import replay


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
    pivot = patching.pivot(index="step", columns="patch", values="kl")
    assert len(pivot) == 2 and (pivot["none"] > 0).all()
    # The whole KV cache recomputed without a cache makes the next step equal to cache-off.
    kv = patching[patching["patch"] == "kv_cache"]
    assert (kv["max_abs_dlogit"] == 0).all() and (kv["kl"] == 0).all()
    # Patching the residual stream of the previous position leaves the difference in place.
    assert (pivot["residual"] >= 0.5 * pivot["none"]).all()
    # Layer drift: the embedding-fed first layer agrees exactly; the difference appears after.
    by_layer = r["layers"].groupby("layer")["l2"].mean()
    assert by_layer[0] == 0 and by_layer[1] > 0


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
    from tokenflip.probes.precision import probe_prompt as precision_probe

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
            assert r["grafting"].empty and r["lens"].empty
            continue
        flipped += 1
        t = int(steps.index[steps["flip"]][0])
        graft = r["grafting"]
        assert sorted(graft["graft"]) == sorted([f"layer {i}" for i in range(2)] + (["kv cache"] if t else []))
        assert len(r["lens"]) == 2 and r["lens"]["top2_agree"].dtype == bool
    assert flipped >= 1  # this tiny model flips between bf16 and fp16 on some of these prompts


def test_precision_probe_of_a_precision_against_itself_is_exactly_zero(prepared_models):
    from tokenflip.probes.precision import probe_prompt as precision_probe

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
    from tokenflip.probes.replay import decoder_layers

    with torch.no_grad():
        for weight in decoder_layers(model)[-1].mlp.parameters():
            weight.copy_(weight.to(torch.float8_e4m3fn).float())
    return model


def test_grafting_the_last_layer_from_b_fixes_every_flip(prepared_models):
    """When a and b differ only inside the last layer (fp32 everywhere, b's last MLP in fp8),
    b's last-layer output grafted into a goes through the same final norm and LM head as in
    b, so a's logits at the flip step become b's bit for bit and the flip is fixed. Grafting
    layer 0 changes nothing (both compute it identically), so it fixes nothing."""
    from tokenflip.probes.precision import probe_prompt as precision_probe
    from tokenflip.probes.replay import all_layers

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
        fixed = dict(zip(r["grafting"]["graft"], r["grafting"]["fixed"]))
        assert fixed.pop("layer 0") is False and fixed.pop("layer 1") is True
        assert list(fixed) == (["kv cache"] if t else [])

        # The same grafts by hand: the logits after the graft are exactly b's (or a's own).
        a = replay(model_a, prompt, use_cache=True, max_new_tokens=24, **kw)
        b = replay(model_b, prompt, use_cache=True, max_new_tokens=24, tokens=a.tokens, **kw)
        assert a.logits[t].argmax() != b.logits[t].argmax()
        upto = a.tokens[: t + 1]
        for patch, expected in (({1: b.layer_outputs[t, 1]}, b.logits[t]),      # the last layer
                                (all_layers(b.layer_outputs[t]), b.logits[t]),   # every layer at once
                                ({0: b.layer_outputs[t, 0]}, a.logits[t])):      # layer 0: a no-op
            grafted = replay(model_a, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                             patch_residual={t: patch}, **kw)
            assert torch.equal(grafted.logits[t], expected)
    assert flipped >= 1  # rounding one MLP to fp8 flips this tiny model on some of these prompts
