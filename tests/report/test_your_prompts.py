"""A user's own prompts (a benchmark of kind `prompts`) are shown with each engine's answer even
where nothing diverged: the summary's `texts` table from the cell files, and the report's
"Your prompts" section from it, texts escaped and long ones folded and bounded."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa

from tokenflip.analysis import texts
from tokenflip.analysis.summary import FIRST_DIV_FIELDS, summary_tables
from tokenflip.core import storage
from tokenflip.core.specs import Cell
from tokenflip.report import page

LONG = "<b>bold?</b> " + "x" * 3000


def _cell_file(path, completions: dict[str, str]) -> str:
    records = [{"prompt_index": i, "prompt_id": pid, "batch_index": i, "prompt_ids": [1], "token_ids": [5, 6],
                "top_ids": np.asarray([[5, 7], [6, 7]], np.int32),
                "top_logits": np.asarray([[1.0, 0.5]] * 2, np.float32), "margin": [0.5, 0.5],
                "logsumexp": [0.0] * 2, "entropy": [0.0] * 2, "intervened": [False] * 2,
                "n_tokens": 2, "finish_reason": "stop" if i else "length", "text": text, "gold": "", "extracted": None,
                "correct": None, "answer_rule": "whole text", "verdict": "not_scored", "latency_s": 0.0}
               for i, (pid, text) in enumerate(completions.items())]
    storage.write_table(storage.cell_table(records, 2), path, {"kind": "cell"})
    return str(path)


def _no_comparisons(summary) -> None:
    """The summary tables every report reads, empty (a run with no finished cell or pair)."""
    columns = {"first_divergence": ["pair_id", "label", "axis", "context", "model", "benchmark", "prompt_id",
                                    *FIRST_DIV_FIELDS]}
    for name in ("cells", "pairs", "first_divergence"):
        storage.write_table(pa.Table.from_pandas(pd.DataFrame(columns=columns.get(name, [])).astype(str)),
                            summary / f"{name}.parquet", {"kind": "summary"})


def test_each_engines_default_answer_to_each_own_prompt_is_in_the_summary_and_the_report(tmp_path):
    source = tmp_path / "traffic.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in [
        {"id": "capital", "prompt": "What is the capital of France?"},
        {"id": "support", "messages": [{"role": "system", "content": "Be terse."},
                                       {"role": "user", "content": "My order has not arrived."},
                                       {"role": "assistant", "content": "Which order?"},
                                       {"role": "user", "content": "Order 1234, placed last Monday."}]},
        {"id": "long", "prompt": LONG}]) + "\n")
    config = {"run": "r", "benchmarks": {"mine": {"kind": "prompts", "source": {"path": str(source)}},
                                         "arith": {"kind": "arithmetic", "n": 2}},
              "decoding": {"greedy": {"strategy": "greedy"}}, "interventions": {"none": {"kind": "none"}}}
    local = Cell("m", "mine", "fp32", "on", 1, "greedy", "none")
    served = Cell("m", "mine", "fp32", "on", 1, "greedy", "none", engine="server")
    cache_off = Cell("m", "mine", "fp32", "off", 1, "greedy", "none")  # not a default cell: left out
    other = Cell("m", "arith", "fp32", "on", 1, "greedy", "none")  # not a `prompts` benchmark: left out
    answers = {local: "Paris.", served: "Paris, of course.", cache_off: "Lyon.", other: "4"}
    paths = {cell.id: _cell_file(tmp_path / f"{i}.parquet", {"capital": text, "support": f"{text} sorry",
                                                             "long": LONG})
             for i, (cell, text) in enumerate(answers.items())}

    frame = texts.prompt_texts_frame(config, list(answers), {cell.id: {} for cell in answers}, paths.__getitem__)

    assert "texts" in summary_tables()
    assert set(frame["cell_id"]) == {local.id, served.id}
    support = frame[frame["prompt_id"] == "support"].set_index("engine")
    assert support.loc["server", "prompt"] == "Order 1234, placed last Monday."
    assert support.loc["server", "completion"] == "Paris, of course. sorry"
    long = frame[frame["prompt_id"] == "long"].iloc[0]
    assert len(long["prompt"]) == len(long["completion"]) == texts.TEXT_CHARS
    assert long["prompt_cut"] and long["completion_cut"] and not support["prompt_cut"].any()

    summary = tmp_path / "summary"
    _no_comparisons(summary)
    storage.write_table(pa.Table.from_pandas(frame, preserve_index=False), summary / "texts.parquet",
                        {"kind": "summary"})
    html = page.render(summary, tmp_path / "report" / "index.html", config).read_text()
    section = html[html.index('<section id="your-prompts">'):]
    section = section[:section.index("</section>")]
    assert '<a href="#your-prompts">Your prompts</a>' in html
    for shown in ("What is the capital of France?", "Order 1234, placed last Monday.", "Paris, of course. sorry",
                  "<th class=\"l\">transformers</th>", "<th class=\"l\">server</th>", "length · 2 tokens"):
        assert shown in section, shown
    assert "My order has not arrived" not in section and "Lyon." not in section
    assert "&lt;b&gt;bold?&lt;/b&gt;" in section and "<b>bold?" not in section
    assert section.count('<details class="long-text">') == 3 and "cut here" in section
    assert "Order 1234" in (tmp_path / "report" / "tables" / "prompts.csv").read_text()


def test_a_report_without_own_prompts_has_no_such_section(tmp_path):
    summary = tmp_path / "summary"
    _no_comparisons(summary)
    html = page.render(summary, tmp_path / "index.html", {"run": "r"}).read_text()
    assert "your-prompts" not in html
