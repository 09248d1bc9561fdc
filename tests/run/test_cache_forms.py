"""The serving-engine cache forms: each equals generate() with the same option, and each
mechanism does what it says.

generate() offers every one of them (cache_implementation="static" or "quantized",
prefill_chunk_size, a pre-filled cache passed in, a compiled forward with a static cache),
so the anchor is the same as for the plain loop: tokens and every step's logits bitwise.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tokenflip.models.prepare import load_prepared
from tokenflip.run.caches import CacheForm, CacheFormError, Prefix, kv_dtype_unavailable, shared_prefix
from tokenflip.run.decode import decode, greedy, left_pad
from tokenflip.run.runtime import eos_ids

TEXTS = ["Tom has 3 apples and buys 4 more. How many apples does he have now? Answer:",
         "A box holds 12 eggs. How many eggs are in 5 boxes? Answer:",
         "Sara reads 7 pages."]


def _batch(tokenizer, n: int):
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS[:n]]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    return ids, mask


def _ours(model, tokenizer, ids, mask, form=CacheForm(), prefix=None, steps=12):
    seen = []

    def select(logits, step):
        seen.append(logits.clone())
        return greedy(logits, step)

    out = decode(model, ids, mask, max_new_tokens=steps, use_cache=True, eos_token_ids=eos_ids(model, tokenizer),
                 pad_token_id=tokenizer.pad_token_id, select=select, form=form, prefix=prefix)
    return out, seen


def _theirs(model, tokenizer, ids, mask, steps=12, **options):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                          eos_token_id=eos_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
                          output_logits=True, return_dict_in_generate=True, **options)


def _assert_same(ours, seen, ref, ids):
    assert ours.steps == len(ref.logits)
    for step, (mine, theirs) in enumerate(zip(seen, ref.logits)):
        assert torch.equal(mine, theirs), f"logits differ at step {step}"
    for row, gen in enumerate(ours.generations):
        assert gen.token_ids == ref.sequences[row, ids.shape[1]:].tolist()[:len(gen.token_ids)]


@pytest.fixture(scope="module")
def llama(prepared_models):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    return model, tokenizer


@pytest.mark.parametrize("rows", [1, 3])
def test_static_cache_equals_generate_static(llama, rows):
    model, tok = llama
    model.__dict__.pop("_previous_max_cache_length", None)
    ids, mask = _batch(tok, rows)
    ours, seen = _ours(model, tok, ids, mask, CacheForm(impl="static"))
    _assert_same(ours, seen, _theirs(model, tok, ids, mask, cache_implementation="static"), ids)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_prefill_equals_generate_prefill_chunk_size(llama, rows, chunk):
    model, tok = llama
    ids, mask = _batch(tok, rows)
    ours, seen = _ours(model, tok, ids, mask, CacheForm(prefill_chunk=chunk))
    _assert_same(ours, seen, _theirs(model, tok, ids, mask, prefill_chunk_size=chunk), ids)


def test_a_chunk_longer_than_the_prompt_is_the_default_bitwise(llama):
    model, tok = llama
    ids, mask = _batch(tok, 3)
    default, seen_default = _ours(model, tok, ids, mask)
    chunked, seen_chunked = _ours(model, tok, ids, mask, CacheForm(prefill_chunk=ids.shape[1] + 7))
    assert all(torch.equal(a, b) for a, b in zip(seen_default, seen_chunked))
    assert [g.token_ids for g in default.generations] == [g.token_ids for g in chunked.generations]


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2", "int4"])
def test_quantized_cache_equals_generate_with_the_same_cache(llama, kv_dtype):
    model, tok = llama
    ids, mask = _batch(tok, 3)
    form = CacheForm(kv_dtype=kv_dtype)
    ours, seen = _ours(model, tok, ids, mask, form)
    _assert_same(ours, seen, _theirs(model, tok, ids, mask, cache=form.new_cache(model, 0)), ids)
    if kv_dtype == "fp8_e4m3":  # the library's own "quantized" cache implementation builds the same cache
        _assert_same(ours, seen, _theirs(model, tok, ids, mask, cache_implementation="quantized",
                                         cache_config={"backend": "fp8"}), ids)
    # The prefill attends to its own exact keys and values; later steps read the stored format.
    default, seen_default = _ours(model, tok, ids, mask)
    assert torch.equal(seen[0], seen_default[0])
    assert not all(torch.equal(a, b) for a, b in zip(seen[1:], seen_default[1:]))


@pytest.mark.parametrize("kv_dtype,fp8", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_an_fp8_cache_holds_exactly_the_fp8_rounded_values(llama, kv_dtype, fp8):
    """At identical inputs, what the FP8 cache gives attention back is the default cache's
    keys and values rounded to FP8 at one per-tensor scale (amax / the format's max)."""
    model, tok = llama
    ids, mask = _batch(tok, 1)
    plain, quantized = CacheForm().new_cache(model, 0), CacheForm(kv_dtype=kv_dtype).new_cache(model, 0)
    model(input_ids=ids, cache=plain, use_cache=True)
    model(input_ids=ids, cache=quantized, use_cache=True)
    fmax = torch.finfo(fp8).max
    for layer_plain, layer_q in zip(plain.layers, quantized.layers):
        for exact, (stored, scale) in ((layer_plain.keys, layer_q._quantized_keys),
                                       (layer_plain.values, layer_q._quantized_values)):
            assert stored.dtype == fp8
            assert float(scale) == pytest.approx(float(exact.abs().amax()) / fmax, rel=1e-6)
            rounded = (exact / scale).to(fp8).float() * scale
            assert torch.equal(layer_q._dequantize((stored, scale)), rounded.to(exact.dtype))
            assert not torch.equal(rounded, exact)  # FP8 really rounds these values
    assert quantized.layers[0]._quantized_keys[0].element_size() == 1


def test_a_shared_prefix_equals_generate_from_a_copied_prefix_cache(llama):
    model, tok = llama
    prompts = [tok(t)["input_ids"] for t in ("The answer is four. " + TEXTS[0], "The answer is four. " + TEXTS[1])]
    common = shared_prefix(prompts)
    assert len(common) >= 4 and all(p[:len(common)] == common for p in prompts)
    calls = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[1]))
    prefix = CacheForm().prefix(model, common)
    assert calls == [len(common)]
    prefix_cache = prefix.cache
    for prompt in prompts:
        ids, mask = left_pad([prompt], tok.pad_token_id)
        calls.clear()
        ours, seen = _ours(model, tok, ids, mask, prefix=prefix)
        assert calls[0] == len(prompt) - len(common)  # only the prompt's own tokens were prefilled
        handle.remove()
        _assert_same(ours, seen, _theirs(model, tok, ids, mask, cache=copy.deepcopy(prefix_cache)), ids)
        handle = model.model.embed_tokens.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[1]))
    handle.remove()
    assert prefix.cache.get_seq_length() == len(common)  # each prompt started from a copy


def test_shared_prefix_leaves_every_prompt_a_token():
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == [1, 2]
    assert shared_prefix([[1, 2, 3], [1, 5]]) == [1]
    assert shared_prefix([[7, 2], [8, 2]]) == []
    assert shared_prefix([]) == []


def test_a_prefix_is_refused_for_padded_batches(llama):
    model, tok = llama
    ids, mask = _batch(tok, 2)
    with pytest.raises(ValueError, match="one unpadded row"):
        _ours(model, tok, ids, mask, prefix=Prefix([ids[0, 0].item()], CacheForm().new_cache(model, 0)))


def test_unavailable_backends_say_why(monkeypatch):
    assert kv_dtype_unavailable("default") is None
    assert kv_dtype_unavailable("fp8_e4m3") is None
    assert "unknown kv_dtype 'fp4'" in kv_dtype_unavailable("fp4")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hqq" else real(name, *a))
    assert "needs the hqq package" in kv_dtype_unavailable("int8")


def test_a_sliding_window_model_refuses_a_quantized_cache(prepared_models):
    model, tok, _ = load_prepared(prepared_models("mistral"), "fp32", "cpu")
    with pytest.raises(CacheFormError, match="kv_dtype fp8_e4m3"):
        CacheForm(kv_dtype="fp8_e4m3").new_cache(model, 0)


@pytest.mark.slow
def test_compiled_static_cache_equals_generate_compiled(llama):
    """compile: on is generate()'s own compiled call (inductor, the library's default compile
    settings) on the decode steps, with a static cache; generate() compiles on a CPU only
    when asked to (CompileConfig._compile_all_devices)."""
    from transformers import CompileConfig

    model, tok = llama
    ids, mask = _batch(tok, 1)
    torch._dynamo.reset()
    # generate() sizes a static cache at the largest length any earlier call used (to avoid
    # recompiling); a cell sizes it per batch, as a fresh model's first generate() does.
    model.__dict__.pop("_previous_max_cache_length", None)
    config = CompileConfig()
    config._compile_all_devices = True
    ref = _theirs(model, tok, ids, mask, steps=6, cache_implementation="static", compile_config=config)
    assert hasattr(model, "_compiled_call")  # generate() did compile
    ours, seen = _ours(model, tok, ids, mask, CacheForm(impl="static", compiled=True), steps=6)
    _assert_same(ours, seen, ref, ids)


# --- The axes: values, refusals, names -------------------------------------------------

def _config(*grids, comparisons=(), interventions=None):
    from tokenflip.study.config import validate

    cfg = {"run": "forms", "models": {"tiny": {"source": "random", "architecture": "llama", "seed": 0}},
           "benchmarks": {"arith": {"kind": "arithmetic", "n": 3, "max_new_tokens": 8}},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], **g} for g in grids],
           "comparisons": list(comparisons)}
    if interventions:
        cfg["interventions"] = interventions
    return validate(cfg, check_data=False)


def _refusal(*grids, **kw) -> str:
    from tokenflip.study.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _config(*grids, **kw)
    return str(err.value)


def test_each_axis_takes_its_values_and_renames_nothing_at_its_default():
    from tokenflip.study.plan import expand_cells, pairs_of_comparison

    config = _config({"prefill_chunk": [16, "default"], "prefix_cache": [False, True]},  # bare YAML off/on
                     {"kv_dtype": ["default", "fp8_e4m3", "fp8_e5m2", "int4"]},
                     {"cache_impl": ["dynamic", "static"]}, {"cache_impl": ["static"], "compile": ["off", "on"]},
                     comparisons=[{"axis": "kv_dtype", "a": "default", "b": "fp8_e4m3"},
                                  {"axis": "prefill_chunk", "a": "default", "b": 16},
                                  {"axis": "prefix_cache", "a": False, "b": True},
                                  {"axis": "cache_impl", "a": "dynamic", "b": "static"}])
    names = sorted(c.name for c in expand_cells(config))
    assert "fp32-on-bs1-greedy-none" in names  # every axis at its default: the name of today
    assert {"fp32-on-bs1-greedy-none-prefill_chunk=16", "fp32-on-bs1-greedy-none-prefix_cache=on",
            "fp32-on-bs1-greedy-none-prefill_chunk=16-prefix_cache=on", "fp32-on-bs1-greedy-none-kv_dtype=fp8_e4m3",
            "fp32-on-bs1-greedy-none-kv_dtype=int4", "fp32-on-bs1-greedy-none-cache_impl=static",
            "fp32-on-bs1-greedy-none-cache_impl=static-compile=on"} <= set(names)
    pairs = [p for comp in config["comparisons"] for p in pairs_of_comparison(comp, expand_cells(config))]
    assert sorted(p.label for p in pairs) == ["cache_impl: dynamic vs static", "kv_dtype: default vs fp8_e4m3",
                                              "prefill_chunk: default vs 16", "prefill_chunk: default vs 16",
                                              "prefix_cache: off vs on", "prefix_cache: off vs on"]


@pytest.mark.parametrize("grid,expected", [
    ({"cache": ["on", "off"], "kv_dtype": ["fp8_e4m3"]}, "kv_dtype 'fp8_e4m3' with cache 'off': with no cache"),
    ({"cache": ["off"], "prefill_chunk": [8]}, "prefill_chunk '8' with cache 'off'"),
    ({"cache": ["off"], "compile": ["on"], "cache_impl": ["static"]}, "compile 'on' with cache 'off'"),
    ({"prefix_cache": ["on"], "batch_size": [1, 4]}, "prefix_cache 'on' with batch size 4: left padding"),
    ({"prefix_cache": ["on"], "cache_impl": ["static"]}, "prefix_cache 'on' with cache_impl 'static'"),
    ({"kv_dtype": ["int4"], "cache_impl": ["static"]}, "quantized caches are dynamic"),
    ({"compile": ["on"]}, "compile 'on' needs cache_impl 'static'"),
    ({"compile": ["on"], "cache_impl": ["dynamic", "static"]}, "compile 'on' needs cache_impl 'static'"),
    ({"compile": ["on"], "cache_impl": ["static"], "prefill_chunk": [8]}, "compile 'on' with prefill_chunk '8'"),
    ({"kv_dtype": ["fp4"]}, "grids.0.kv_dtype.0: 'fp4' is not one of"),
    ({"prefill_chunk": [0]}, "grids.0.prefill_chunk.0"),
    ({"cache_impl": ["sliding"]}, "'sliding' is not one of"),
])
def test_combinations_that_cannot_run_are_refused_with_the_reason(grid, expected):
    assert expected in _refusal(grid)


def test_compile_is_refused_with_an_intervention_that_runs_model_copies():
    message = _refusal({"compile": ["on"], "cache_impl": ["static"], "intervention": ["vote"]},
                       interventions={"none": {"kind": "none"}, "vote": {"kind": "consensus", "precisions": ["fp32", "bf16"]}})
    assert "compile 'on' with intervention 'vote'" in message


def test_an_uninstalled_backend_is_refused_at_validation(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hqq" else real(name, *a))
    assert "grids.0: kv_dtype int8: transformers' 'hqq' cache backend needs the hqq package" in \
        _refusal({"kv_dtype": ["int8"]})


# --- A study: each form is a cell, each pair is compared and reported like any axis ----

@pytest.mark.slow
def test_a_study_compares_and_reports_every_cache_form(tmp_path):
    import pyarrow.parquet as pq
    import yaml
    from test_workflow import snakemake

    from tokenflip.core import storage

    base = {"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}
    cfg = {"run": "forms", "models": {"tiny": {"source": "random", "architecture": "llama", "seed": 0}},
           "benchmarks": {"steps": {"kind": "onestep", "n": 3, "seed": 0, "shots": 1, "max_new_tokens": 8}},
           "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
           "grids": [dict(base, prefill_chunk=["default", 4]), dict(base, prefix_cache=["on"]),
                     dict(base, kv_dtype=["fp8_e4m3"]), dict(base, cache_impl=["static"], compile=["off", "on"])],
           "comparisons": [{"axis": "prefill_chunk", "a": "default", "b": 4},
                           {"axis": "prefix_cache", "a": "off", "b": "on"},
                           {"axis": "kv_dtype", "a": "default", "b": "fp8_e4m3"},
                           {"axis": "cache_impl", "a": "dynamic", "b": "static"},
                           {"axis": "compile", "a": "off", "b": "on"}],
           "probes": {"kv_cache": {"prompts": 1, "precisions": ["fp32"], "patch_steps": 0,
                                   "forms": ["kv_dtype=fp8_e4m3", "prefill_chunk=4"]}}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(tmp_path, config)
    run = tmp_path / "results" / "forms"
    pairs = {p["axis"]: p for p in pq.read_table(run / "summary" / "pairs.parquet").to_pylist()}
    assert set(pairs) == {"prefill_chunk", "prefix_cache", "kv_dtype", "cache_impl", "compile"}
    assert all(p["status"] == "done" for p in pairs.values()), pairs
    assert pairs["compile"]["context"] == "fp32-on-bs1-greedy-none-cache_impl=static-compile=x"
    cells = run / "cells" / "tiny" / "steps"
    forms = {path.stem: storage.read_table(path)[1]["cache_form"] for path in cells.glob("*.parquet")}
    assert forms["fp32-on-bs1-greedy-none"] == {"impl": "dynamic", "kv_dtype": "default", "prefill_chunk": None,
                                                "prefix_cache": False, "compiled": False, "compile": None,
                                                "prefix_tokens": 0}
    assert forms["fp32-on-bs1-greedy-none-prefill_chunk=4"]["prefill_chunk"] == 4
    # The one-shot exemplar (and the chat template's system turn) is what every prompt shares.
    assert forms["fp32-on-bs1-greedy-none-prefix_cache=on"]["prefix_tokens"] > 20
    assert forms["fp32-on-bs1-greedy-none-kv_dtype=fp8_e4m3"]["backend"] == {"name": "fp8", "package": None}
    compiled = forms["fp32-on-bs1-greedy-none-cache_impl=static-compile=on"]["compile"]
    assert compiled["backend"] == "inductor" and compiled["torch"] == torch.__version__ and compiled["cxx_version"]
    # The KV probe replays the default cache's trajectory through the two forms it was given.
    forms_table = pq.read_table(run / "summary" / "kv_forms.parquet").to_pandas()
    assert sorted(forms_table["form"].unique()) == ["kv_dtype=fp8_e4m3", "prefill_chunk=4"]
    assert (forms_table.groupby("form")["step"].count() == len(forms_table) // 2).all()
    html = (tmp_path / "reports" / "forms" / "index.html").read_text()
    assert 'id="form-table"' in html and "kv_dtype=fp8_e4m3" in html
    for label in ("prefill_chunk: default vs 4", "prefix_cache: off vs on", "kv_dtype: default vs fp8_e4m3",
                  "cache_impl: dynamic vs static", "compile: off vs on"):
        assert label in html


def test_the_kv_probe_replays_the_default_trajectory_through_each_form(llama):
    from tokenflip.run.probes.kv_cache import probe_prompt

    model, tok = llama
    prompt = tok(TEXTS[0])["input_ids"]
    out = probe_prompt(model, prompt, 10, [-1], tok.pad_token_id, 0,
                       forms=["kv_dtype=fp8_e4m3", f"prefill_chunk={len(prompt) + 1}", "prefill_chunk=3"])
    rows = {}
    for r in out["forms"]:
        rows.setdefault(r["form"], []).append(r)
    assert {form: len(r) for form, r in rows.items()} == {"kv_dtype=fp8_e4m3": 10, f"prefill_chunk={len(prompt) + 1}": 10,
                                                          "prefill_chunk=3": 10}
    # A chunk longer than the prompt is the default computation: nothing differs.
    assert all(r["kl"] == 0 and r["max_abs_dlogit"] == 0 and not r["flip"] for r in rows[f"prefill_chunk={len(prompt) + 1}"])
    fp8 = rows["kv_dtype=fp8_e4m3"]
    assert fp8[0]["max_abs_dlogit"] == 0  # the prefill attends to its exact keys and values
    assert all(r["kl"] > 0 for r in fp8[1:])  # every later step reads the FP8-rounded cache
    assert all(r["top1_on"] == t for r, t in zip(fp8, [s["top1_on"] for s in out["steps"]]))
