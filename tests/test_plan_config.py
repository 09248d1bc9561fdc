"""Config validation and the cell/pair plan derived from it."""

from __future__ import annotations

import copy
import json

import pytest

from tokenflip import config as cfg
from tokenflip.jobs import CellJob
from tokenflip.layout import RunLayout
from tokenflip.plan import Cell, Pair, cell_job, expand_cells, expand_pairs

from conftest import REPO

BASE = {
    "run": "t",
    "models": {"m1": {"source": "random", "architecture": "llama"}},
    "benchmarks": {"arith": {"kind": "arithmetic", "n": 3}},
    "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": [1]},
              {"precision": ["bf16"], "cache": ["on"], "batch_size": [4]}],
    "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                    {"axis": "precision", "a": "fp32", "b": "bf16"},
                    {"axis": "batch_size", "a": 1, "b": 4}],
}


def valid(**changes):
    c = copy.deepcopy(BASE)
    c.update(changes)
    return cfg.validate(c, source="test.yaml")


def test_defaults_are_filled():
    c = valid()
    assert c["generation"] == {"max_new_tokens": 128, "record_top_k": 16, "device": "auto", "threads": None}
    assert c["decoding"] == {"greedy": {"strategy": "greedy"}}
    assert c["interventions"] == {"none": {"kind": "none"}}


def test_cells_and_pairs():
    c = valid()
    cells = expand_cells(c)
    assert len(cells) == 5
    pairs = expand_pairs(c, cells)
    labels = sorted((p.axis, p.a.name, p.b.name) for p in pairs)
    assert labels == [
        ("batch_size", "bf16-on-bs1-greedy-none", "bf16-on-bs4-greedy-none"),
        ("cache", "bf16-on-bs1-greedy-none", "bf16-off-bs1-greedy-none"),
        ("cache", "fp32-on-bs1-greedy-none", "fp32-off-bs1-greedy-none"),
        ("precision", "fp32-off-bs1-greedy-none", "bf16-off-bs1-greedy-none"),
        ("precision", "fp32-on-bs1-greedy-none", "bf16-on-bs1-greedy-none"),
    ]
    for pair in pairs:
        assert Pair.from_id(pair.id) == pair
        model, bench, axis, ab, context = pair.id.split("/")
        a, b = ab.split("_vs_")
        assert Pair.from_parts(model, bench, axis, a, b, context) == pair


def test_cell_names_round_trip():
    cell = Cell("m", "b", "fp16", "off", 8, "greedy", "none")
    assert RunLayout("r").cell(cell.id) == "results/r/cells/m/b/fp16-off-bs8-greedy-none.parquet"
    assert Cell.from_name("m", "b", cell.name) == cell
    assert Cell.from_dict(json.loads(json.dumps(cell.as_dict()))) == cell


def test_cell_settings_depend_on_their_own_model_and_benchmark_only():
    c = valid()
    cell = expand_cells(c)[0]
    before = cell_job(c, cell).to_json()
    c2 = copy.deepcopy(BASE)
    c2["models"]["m2"] = {"source": "random", "architecture": "mistral"}
    c2["benchmarks"]["other"] = {"kind": "arithmetic", "n": 7}
    c2 = cfg.validate(c2)
    assert cell_job(c2, cell).to_json() == before
    c3 = copy.deepcopy(c2)
    c3["benchmarks"]["other"]["n"] = 9
    assert cell_job(c3, cell).to_json() == before


def test_yaml_booleans_for_cache_mean_on_and_off():
    c = copy.deepcopy(BASE)
    c["grids"][0]["cache"] = [True, False]
    c["comparisons"][0] = {"axis": "cache", "a": True, "b": False}
    assert cfg.validate(c)["grids"][0]["cache"] == ["on", "off"]


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c["grids"][0].update(precision=["fp8"]), "grids.0.precision.0: 'fp8' is not one of"),
    (lambda c: c["grids"][0].update(batch_size=[0]), "grids.0.batch_size.0: 0 is below the minimum 1"),
    (lambda c: c["benchmarks"]["arith"].update(kind="mmlu"), "benchmarks.arith.kind: 'mmlu' is not one of"),
    (lambda c: c["models"].update({"bad/name": {"source": "random", "architecture": "llama"}}),
     "'bad/name' contains characters that are not allowed"),
    (lambda c: c["comparisons"].append({"axis": "precision", "a": "fp32", "b": "fp16"}),
     "comparisons.3.b: 'fp16' is not a value of axis 'precision'"),
    (lambda c: c["grids"][0].update(decoding=["beam"]), "grids.0.decoding: 'beam' is not defined under 'decoding'"),
    (lambda c: c.update(colour="red"), "unknown key(s) ('colour' was unexpected)"),
    (lambda c: c["models"]["m1"].update(source="ollama"), "models.m1.source: 'ollama' is not one of"),
])
def test_bad_config_names_key_and_value(mutate, needle):
    c = copy.deepcopy(BASE)
    mutate(c)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(c, source="my.yaml")
    assert needle in str(err.value)
    assert "my.yaml" in str(err.value)


def test_duplicate_keys_in_yaml_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("run: x\nmodels:\n  a: {source: random, architecture: llama}\n"
                    "  a: {source: random, architecture: mistral}\n")
    with pytest.raises(cfg.ConfigError, match=r"dup.yaml: duplicate key 'a' at line 4 \(first at line 3\)"):
        cfg.read_yaml(path)


def test_shipped_configs_are_valid():
    for path in sorted((REPO / "config").glob("*.yaml")):
        c = cfg.load(path)
        assert expand_pairs(c, expand_cells(c)), path
