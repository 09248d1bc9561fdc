"""The examples of docs/extending.md are real: each one, taken from that page, registered
with one line, is accepted by the config, planned, run on a tiny model and summarised like
the built-in ones."""

from __future__ import annotations

import importlib.util
import re

import pyarrow.parquet as pq
import pytest
import torch

from conftest import REPO, tiny_study
from tokenflip.analysis.summary import summary_tables, write_summaries
from tokenflip.core.layout import RunLayout
from tokenflip.run.benchmarks import BENCHMARKS
from tokenflip.run.cell import run_cell
from tokenflip.run.interventions import INTERVENTIONS
from tokenflip.run.probes import PROBES
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells, expand_pairs, probe_job, probe_targets


def extending_examples() -> dict[str, str]:
    """The python blocks of docs/extending.md that follow an `<!-- extending: NAME -->` marker."""
    text = (REPO / "docs" / "extending.md").read_text()
    found = dict(re.findall(r"<!-- extending: (\S+) -->\s*```python\n(.*?)```", text, re.S))
    assert set(found) == {"letter_count.py", "round_bf16.py", "entropy.py"}, sorted(found)
    return found


@pytest.fixture(scope="module")
def extensions(tmp_path_factory):
    """The page's modules imported from files and registered (the 'one registry line')."""
    root = tmp_path_factory.mktemp("extending")
    modules = {}
    for name, source in extending_examples().items():
        path = root / name
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"extending_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path.stem] = module
    BENCHMARKS.register(modules["letter_count"].LetterCountBenchmark)
    INTERVENTIONS.register(modules["round_bf16"].ROUND_BF16)
    PROBES.register(modules["entropy"].ENTROPY)
    yield modules
    BENCHMARKS.unregister("letter_count")
    INTERVENTIONS.unregister("round_bf16")
    PROBES.unregister("entropy")


def study() -> dict:
    config = tiny_study()
    config.update(
        run="ext",
        benchmarks={"letters": {"kind": "letter_count", "n": 3, "max_new_tokens": 6}},
        interventions={"none": {"kind": "none"}, "rounded": {"kind": "round_bf16"}},
        grids=[{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "intervention": ["none", "rounded"]}],
        comparisons=[{"axis": "intervention", "a": "none", "b": "rounded"}],
        probes={"entropy": {"prompts": 2, "precisions": ["fp32", "bf16"]}},
    )
    return config


def test_the_documented_extensions_are_unknown_until_registered():
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(study(), source="ext.yaml")
    text = str(err.value)
    assert "'letter_count' is not one of" in text and "'round_bf16' is not one of" in text
    assert "'entropy' was unexpected" in text


def test_the_documented_extensions_run_like_the_built_in_ones(extensions, prepared_models, tmp_path):
    config = cfg.validate(study(), source="ext.yaml")
    assert config["benchmarks"]["letters"]["seed"] == 0   # the example's schema default, filled in
    with pytest.raises(cfg.ConfigError, match=r"benchmarks.letters: unknown key\(s\)"):
        cfg.validate({**study(), "benchmarks": {"letters": {"kind": "letter_count", "colour": "red"}}})

    layout = RunLayout(config["run"], root=str(tmp_path))
    cells = expand_cells(config)
    assert [c.intervention for c in cells] == ["none", "rounded"]
    model_dir = prepared_models("llama")
    metas = {c.intervention: run_cell(cell_job(config, c), model_dir, layout.cell(c.id), progress=False)
             for c in cells}
    tables = {name: pq.read_table(layout.cell(c.id)) for name, c in zip(("none", "rounded"), cells)}
    # The benchmark: its items and gold answers.
    assert tables["none"].column("gold").to_pylist() == [str(len(w)) for w in _words(extensions, 3)]
    # The intervention: every recorded logit of the rounded cell is a bfloat16 value, and
    # the plain cell's are not all.
    rounded = torch.tensor(tables["rounded"].column("top_logits").combine_chunks().flatten().flatten()
                           .to_numpy())
    plain = torch.tensor(tables["none"].column("top_logits").combine_chunks().flatten().flatten().to_numpy())
    assert torch.equal(rounded, rounded.to(torch.bfloat16).float())
    assert not torch.equal(plain, plain.to(torch.bfloat16).float())
    assert metas["rounded"]["settings"]["intervention"] == {"kind": "round_bf16"}

    # The probe: one job per model x benchmark, its table written and summarised.
    assert probe_targets(config) == [("entropy", "tiny", "letters")]
    job = probe_job(config, "entropy", "tiny", "letters")
    PROBES["entropy"].run(job, model_dir, layout.probe_dir("entropy", "tiny", "letters"))
    steps = pq.read_table(layout.probe_table("entropy", "tiny", "letters", "steps")).to_pandas()
    assert set(steps["precision"]) == {"fp32", "bf16"} and steps["prompt_id"].nunique() == 2
    assert (steps["entropy"] >= 0).all()

    from tokenflip.analysis.compare import compare_files

    (pair,) = expand_pairs(config, cells)
    compare_files(pair, layout.cell(pair.a.id), layout.cell(pair.b.id), layout.pair(pair.id))
    assert "entropy_steps" in summary_tables()
    write_summaries(config, layout)
    summary = pq.read_table(layout.summary("entropy_steps")).to_pandas()
    assert len(summary) == len(steps) and set(summary["model"]) == {"tiny"}
    pairs = pq.read_table(layout.summary("pairs")).to_pandas()
    assert pairs["status"].tolist() == ["done"]


def _words(extensions, n: int) -> list[str]:
    bench = extensions["letter_count"].LetterCountBenchmark("letters", n=n)
    return [item.question.split("'")[1] for item in bench.items()]

