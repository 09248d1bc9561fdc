"""Every parser is bounded before it builds: nesting depth, an integer's digits, a Parquet
file's rows and the size its repeated values expand to, a study's prompts through its rounds.
Each hostile file is refused in one message naming it, quickly and in little memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tiny_study
from tokenflip.core.inputs import InputError, loads_json
from tokenflip.run.benchmarks import BenchmarkError, build_benchmark
from tokenflip.study import config as cfg


def items(path, **spec):
    return build_benchmark("mine", {"kind": "prompts", "order": "source", "source": {"path": str(path)},
                                    **spec}).items()


def test_a_conversation_nested_100000_deep_is_refused_by_depth_not_recursion(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(BenchmarkError, match=r"deep\.jsonl line 1: nested deeper than 64 levels"):
        items(path)
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BenchmarkError, match=r"deep\.json: nested deeper than 64 levels"):
        items(tmp_path / "deep.json")


def test_an_integer_of_5000_digits_is_refused_by_its_digits(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "hi", "id": ' + "7" * 5000 + "}\n")
    with pytest.raises(BenchmarkError, match=r"big\.jsonl line 1: .*an integer of 5,000 digits, more than the 40"):
        items(path)
    with pytest.raises(InputError, match=r"an integer of 41 digits"):
        loads_json("-" + "1" * 41, "a token id")
    assert loads_json(str(2**64), "a seed") == 2**64  # the largest seed a config holds


def test_a_parquet_file_of_3_million_rows_is_refused_from_its_footer(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": pa.array(["hi"] * 3_000_000)}), path)
    assert path.stat().st_size < 100_000
    with pytest.raises(BenchmarkError, match=r"rows\.parquet: holds 3,000,000 records, more than the 100,000"):
        items(path)


def test_a_parquet_file_whose_repeated_text_expands_to_a_gigabyte_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.parquet"
    value = "x" * 2**20
    pq.write_table(pa.table({"prompt": pa.DictionaryArray.from_arrays(pa.array([0] * 1024, pa.int32()),
                                                                      pa.array([value]))}), path,
                   compression="zstd")
    assert path.stat().st_size < 600_000
    pa_before = pa.total_allocated_bytes()
    with pytest.raises(BenchmarkError, match=r"bomb\.parquet: its values expand to more than the 67108864"):
        items(path)
    assert pa.total_allocated_bytes() - pa_before < 2**26


@pytest.mark.parametrize("kind", ["jsonl", "csv", "json"])
def test_a_text_file_of_more_records_than_the_bound_is_refused_before_its_records_are_built(tmp_path, kind):
    path = tmp_path / f"many.{kind}"
    if kind == "jsonl":
        path.write_text('{"prompt": "a"}\n' * 100_001)
    elif kind == "csv":
        path.write_text("prompt\n" + "a\n" * 100_001)
    else:
        path.write_text(json.dumps([{"prompt": "a"}] * 100_001))
    with pytest.raises(BenchmarkError, match=rf"many\.{kind}: holds (over )?100,00\d records, more than the 100,000"):
        items(path)


def test_rounds_maxima_count_against_the_plans_limit_of_prompts():
    study = tiny_study()
    study["benchmarks"] = {"arith": {"kind": "arithmetic", "max_new_tokens": 6}}
    study["rounds"] = {"max_prompts": 10**9}
    with pytest.raises(cfg.ConfigError, match=r"benchmarks: 2,000,000,000 prompts to generate over the cells, more "
                                              r"than limits.max_prompts 1,000,000"):
        cfg.validate(study, source="test", check_data=False)


def test_a_nested_column_of_repeated_text_is_refused_within_a_few_rows_of_the_bound(tmp_path):
    """`messages` as a list of turns cannot be read dictionary-encoded: it is read 16 rows at
    a time and measured as it goes, so 2,000 rows of one repeated 100 kB turn (200 MB in all)
    are refused having built a few megabytes, never the whole column."""
    path = tmp_path / "nested.parquet"
    turn = {"role": "user", "content": "y" * 100_000}
    pq.write_table(pa.table({"messages": [[turn]] * 2000}), path, compression="zstd")
    assert path.stat().st_size < 200_000
    with pytest.raises(BenchmarkError, match=r"nested\.parquet: its values expand to more than the 67108864"):
        items(path)
    # Arrow's peak in a process of its own: reading the whole column would reach 200 MB.
    script = ("import pyarrow as pa\nfrom tokenflip.run.benchmarks import build_benchmark\n"
              "try:\n    build_benchmark('m', {'kind': 'prompts', 'order': 'source', 'source': {'path': "
              f"{str(path)!r}}}}}).items()\nexcept Exception:\n    pass\nprint(pa.default_memory_pool().max_memory())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and int(done.stdout) < 100 * 2**20, done.stdout + done.stderr
