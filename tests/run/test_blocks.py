"""A cell made in blocks is the cell made at once: its blocks, joined, hold the same token
ids, logits and digests, batch by batch (block ends are multiples of the batch size); a
block made with other settings, holding other prompts, or made with other software than the
cell's first block is refused naming the file."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from conftest import tiny_study
from tokenflip.core import storage
from tokenflip.core.specs import CellJob, JobSpecError
from tokenflip.run.cell import run_cell
from tokenflip.run.blocks import BlockError, join_blocks
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells


@pytest.fixture(scope="module")
def made(prepared_models, tmp_path_factory):
    """One cell (batch size 2, 6 prompts) made at once, and as blocks [0, 4) and [4, 6)."""
    study = tiny_study()
    study["benchmarks"] = {"arith": {"kind": "arithmetic", "n": 6, "max_new_tokens": 5}}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [2]}]
    study["comparisons"], study["probes"] = [], {}
    config = cfg.validate(study, check_data=False)
    job = cell_job(config, expand_cells(config)[0])
    out = tmp_path_factory.mktemp("blocks")
    model = prepared_models("llama")
    run_cell(job, model, out / "whole.parquet", progress=False)
    blocks = [(str(out / f"{first}-{end}.parquet"), first, end) for first, end in ((0, 4), (4, 6))]
    for path, first, end in blocks:
        run_cell(job.block(first, end), model, path, progress=False)
    return job, out, blocks


def test_joined_blocks_are_the_cell_made_at_once(made, tmp_path):
    job, out, blocks = made
    meta = join_blocks(job, blocks, tmp_path / "joined.parquet")
    whole, whole_meta = storage.read_cell(out / "whole.parquet")
    joined, _ = storage.read_cell(tmp_path / "joined.parquet")
    for column in ("prompt_index", "prompt_id", "batch_index", "prompt_ids", "token_ids", "top_ids", "top_logits"):
        assert joined.column(column).to_pylist() == whole.column(column).to_pylist(), column
    assert joined.column("prompt_index").to_pylist() == list(range(6))
    assert joined.column("batch_index").to_pylist() == [0, 0, 1, 1, 2, 2]
    assert meta["token_stream_sha256"] == whole_meta["token_stream_sha256"]
    assert meta["logits_sha256"] == whole_meta["logits_sha256"]
    assert meta["settings"] == whole_meta["settings"] == job.to_json()
    assert [b["prompts"] for b in meta["blocks"]] == [[0, 4], [4, 6]]
    assert meta["observed"]["prompts"] == 6 and meta["benchmark"]["n"] == 6 and "block" not in meta["benchmark"]


def test_a_block_job_does_not_depend_on_the_studys_n(made):
    job, _, _ = made
    raised = CellJob.from_json({**job.to_json(), "benchmark": {**job.benchmark, "n": 600}})
    assert raised.block(0, 4).to_json() == job.block(0, 4).to_json()
    assert job.block(4, 6).to_json()["prompts"] == [4, 6] and job.block(4, 6).benchmark["n"] == 6
    assert CellJob.from_json(job.block(4, 6).dumps()) == job.block(4, 6)
    for bad in ([4, 4], [-1, 2], [0], ["0", 2]):
        with pytest.raises(JobSpecError, match="prompts"):
            CellJob.from_json({**job.to_json(), "prompts": bad})


def test_a_block_of_other_settings_or_prompts_is_refused_naming_it(made, tmp_path):
    job, _, blocks = made
    (first_path, _, _), (second_path, _, _) = blocks
    with pytest.raises(BlockError, match="4-6.parquet: made with other settings than block \\[0, 4\\)"):
        join_blocks(job, [(second_path, 0, 4)], tmp_path / "x.parquet")
    other = CellJob.from_json({**job.to_json(), "max_new_tokens": 9})
    with pytest.raises(BlockError, match="0-4.parquet: made with other settings"):
        join_blocks(other, blocks, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_a_block_made_with_other_software_is_not_joined_to_the_first(made, tmp_path):
    job, _, blocks = made
    table, meta = storage.read_cell(blocks[1][0])
    meta["environment"]["software"]["torch"] = "0.0.1"
    forged = tmp_path / "4-6.parquet"
    storage.write_table(table.replace_schema_metadata({}), forged, {k: v for k, v in meta.items()
                                                                     if k not in ("schema_version", "table_sha256")})
    assert json.loads(pq.read_schema(forged).metadata[b"tokenflip"])["environment"]["software"]["torch"] == "0.0.1"
    with pytest.raises(BlockError, match="environment.software.torch = '0.0.1'.*one model, software and machine"):
        join_blocks(job, [blocks[0], (str(forged), 4, 6)], tmp_path / "x.parquet")


def test_a_block_holding_other_prompts_than_its_span_is_not_joined(made, tmp_path):
    """A block file with the right settings whose rows are not its span (an older engine
    that decoded the whole benchmark for a block) is refused naming the file and the rows."""
    job, _, blocks = made
    table, meta = storage.read_cell(blocks[0][0])
    forged, short = tmp_path / "0-4.parquet", table.slice(0, 3).replace_schema_metadata({})
    meta = {**meta, "token_stream_sha256": storage.token_stream_digest(short),
            "logits_sha256": storage.logits_digest(short)}
    storage.write_table(short, forged, {k: v for k, v in meta.items() if k not in ("schema_version", "table_sha256")})
    with pytest.raises(BlockError, match="0-4.parquet: holds prompts 0 to 2, 3 rows, not \\[0, 4\\) \\(remove it"):
        join_blocks(job, [(str(forged), 0, 4), blocks[1]], tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_a_cell_whose_engine_decoded_other_prompts_than_its_job_fails_naming_them(made):
    """The runner's own check, whatever the engine: a block's job answered with the whole
    benchmark (what an engine rebuilding the benchmark by itself would decode), a prompt
    dropped, or two swapped, fails the cell before its rows are numbered."""
    from types import SimpleNamespace

    from tokenflip.run.benchmarks import job_benchmark
    from tokenflip.run.cell import CellMismatch, check_decoded_prompts

    job, _, _ = made
    block = job.block(4, 6)
    whole, part = job_benchmark(job).items(), job_benchmark(block).items()
    assert [item.id for item in part] == [item.id for item in whole[4:6]]
    check_decoded_prompts(block, job_benchmark(block), [SimpleNamespace(items=part)], "transformers")
    cases = {
        "the whole benchmark": ([SimpleNamespace(items=whole[0:2]), SimpleNamespace(items=whole[2:6])],
                                f"decoded 6; they first differ at position 0 "
                                f"\\({part[0].id} asked, {whole[0].id} decoded\\)"),
        "one dropped": ([SimpleNamespace(items=part[:1])], f"decoded 1; they first differ at position 1 "
                                                          f"\\({part[1].id} asked, none decoded\\)"),
        "two swapped": ([SimpleNamespace(items=part[::-1])], "decoded 2; they first differ at position 0"),
    }
    asks = f"cell {job.cell.id}: the job asks prompts \\[4, 6\\), 2 in all, but engine 'x' "
    for name, (batches, message) in cases.items():
        with pytest.raises(CellMismatch, match=asks + message):
            check_decoded_prompts(block, job_benchmark(block), batches, "x")


def test_blocks_made_from_two_versions_of_a_prompts_file_are_not_joined(prepared_models, tmp_path):
    """A prompts file edited between two rounds: the second block is refused, naming it, the
    field that differs and the file; each joined block keeps the digest of its inputs."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(6)))
    study = tiny_study()
    study["benchmarks"] = {"mine": {"kind": "prompts", "order": "source", "n": 6, "max_new_tokens": 3,
                                    "source": {"path": str(prompts)}}}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [2]}]
    study["comparisons"], study["probes"] = [], {}
    config = cfg.validate(study, check_data=False)
    job, model = cell_job(config, expand_cells(config)[0]), prepared_models("llama")
    blocks = [(str(tmp_path / f"{first}-{end}.parquet"), first, end) for first, end in ((0, 4), (4, 6))]
    run_cell(job.block(0, 4), model, blocks[0][0], progress=False)
    run_cell(job.block(4, 6), model, blocks[1][0], progress=False)
    meta = join_blocks(job, blocks, tmp_path / "same.parquet")
    assert len({block["inputs_sha256"] for block in meta["blocks"]}) == 1
    prompts.write_text(prompts.read_text().replace("Count to 5.", "Count to 50."))
    run_cell(job.block(4, 6), model, blocks[1][0], progress=False)
    with pytest.raises(BlockError, match=r"4-6\.parquet: made from other inputs than the cell's first block "
                                         r"\(.*0-4\.parquet\): benchmark source\.sha256 differs \(.*prompts\.jsonl "
                                         r"changed between them\?\)"):
        join_blocks(job, blocks, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
