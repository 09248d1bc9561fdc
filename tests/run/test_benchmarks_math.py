"""Tests for MATH-500 (boxed extraction, normalisation, sympy equivalence and which rule
decided), GSM8K's few-shot mode, and the shared data sources."""

from __future__ import annotations

import json
import re
import sys
import time
import types
from collections import Counter

import pytest
import yaml

from conftest import SHARED_DATA as DATA  # noqa: E402
from conftest import TEST_DATA  # noqa: E402
from tokenflip.run.benchmarks import (
    MATH_SYSTEM_PROMPT,
    BenchmarkError,
    GSM8KBenchmark,
    Item,
    Math500Benchmark,
    build_benchmark,
    last_boxed,
)
from tokenflip.run.benchmarks.math500 import BOXED_SYSTEM_PROMPT
from tokenflip.run.benchmarks.math_equiv import RULES

MATH500 = DATA / "math500" / "test.jsonl"
GSM8K_TEST = DATA / "gsm8k" / "test.jsonl"

needs_math500 = pytest.mark.skipif(not MATH500.is_file(), reason=f"MATH-500 data not found at {MATH500}")
needs_gsm8k = pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"GSM8K data not found at {GSM8K_TEST}")


def _fake_datasets(monkeypatch, load_dataset):
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)


# --- MATH-500 on the real data -------------------------------------------------------------


@needs_math500
def test_math500_boxed_solutions_equal_answers():
    bench = build_benchmark("m", {"kind": "math500", "order": "source", "source": {"path": str(MATH500)}})
    items = bench.items()
    assert len(items) == 500
    ids = [i.id for i in items]
    assert len(set(ids)) == 500 and all(re.fullmatch(r"math500-[A-Za-z0-9-]+", i) for i in ids)
    assert ids[0] == "math500-precalculus-807"
    scores = [bench.score(item, item.solution) for item in items]
    # The dataset's own solutions end in their \\boxed answer: all 500 score.
    assert sum(s.correct for s in scores) == 500, [(i.id, s.extracted, i.gold) for i, s in zip(items, scores)
                                                   if not s.correct]
    assert Counter(s.rule for s in scores) == {"boxed": 500}
    assert all(bench.is_correct(item, f"so the answer is $\\boxed{{{item.gold}}}$.") for item in items)


@needs_math500
def test_math500_prompt_and_describe():
    bench = build_benchmark("m", {"kind": "math500", "order": "source", "n": 3, "source": {"path": str(MATH500)}})
    item = bench.items()[0]
    assert bench.messages(item) == [{"role": "system", "content": BOXED_SYSTEM_PROMPT},
                                    {"role": "user", "content": item.question}]
    info = bench.describe()
    assert info["n"] == 3 and info["prompt_format"] == "chat, 0-shot"
    assert "math-verify" in info["scorer"] and info["math_verify"] == "0.9.0"
    assert info["answer_rules"] == list(RULES) and info["stop"] == []
    assert info["source"]["path"] == str(MATH500) and len(info["source"]["sha256"]) == 64
    json.dumps(info)


@needs_math500
def test_math500_from_parquet_and_json(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()[:20]]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "m.parquet")
    (tmp_path / "m.json").write_text(json.dumps(records))
    expected = build_benchmark("m", {"kind": "math500", "order": "source", "n": 20, "source": {"path": str(MATH500)}}).items()
    for name in ("m.parquet", "m.json"):
        assert build_benchmark("m", {"kind": "math500", "order": "source", "source": {"path": str(tmp_path / name)}}).items() == expected


def test_math500_hub_default_and_offline_error(monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return [{"problem": "1+1?", "answer": "2", "solution": "$\\boxed{2}$", "unique_id": "test/algebra/1.json"}]

    _fake_datasets(monkeypatch, load_dataset)
    bench = build_benchmark("m", {"kind": "math500", "order": "source", "source": {"revision": "r1"}})
    assert [i.id for i in bench.items()] == ["math500-algebra-1"]
    assert calls == [(("HuggingFaceH4/MATH-500",), {"split": "test", "revision": "r1"})]

    def offline(*args, **kwargs):
        raise FileNotFoundError("not cached")

    _fake_datasets(monkeypatch, offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BenchmarkError, match=r"'m' \(math500\).*HuggingFaceH4/MATH-500@unpinned.*HF_HUB_OFFLINE"):
        build_benchmark("m", {"kind": "math500", "order": "source"}).items()


# --- extraction, normalisation and equivalence -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $\\boxed{5}$.", "5"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{x^{2}+\\{1\\}}", "x^{2}+\\{1\\}"),
        ("\\boxed 7$", "7"),
        ("\\fbox{9}", "9"),
        ("\\boxed{1} and then \\boxed{unbalanced", "1"),
        ("no box here, the answer is 4", None),
        ("", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


# --- equivalence: math-verify, checked against a careful human judge ----------------------------

REWRITES = yaml.safe_load((TEST_DATA / "math500_rewrites.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def math500_by_uid():
    bench = build_benchmark("m", {"kind": "math500", "order": "source", "source": {"path": str(MATH500)}})
    records = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()]
    return bench, {record["unique_id"]: item for record, item in zip(records, bench.items())}


def _rewrite_completion(case: dict) -> str:
    return case["completion"] if case.get("unboxed") else "The final answer is $\\boxed{" + case["answer"] + "}$."


@needs_math500
def test_math500_scores_rewrites_of_the_real_answers_as_math_verify_does(math500_by_uid):
    """379 rewrites of MATH-500's real answers (tests/data/math500_rewrites.yaml: 353 boxed and
    26 unboxed final answers, right and wrong), each with a careful human judge's verdict and
    math-verify 0.9.0's, recorded by calling math-verify directly on the same text. The scorer
    is math-verify, so it gives math-verify's verdict on every one. math-verify agrees with the
    judge on 352; each of the 27 differences is explained in the file's `note`. The scorer
    is wrong with it there: it accepts a number whose base subscript is wrong (`204_6`),
    a dollar or metre amount where cents or centimetres were asked (units are stripped), a
    plane's equation that breaks the problem's gcd condition, and `13.287197` for 3840/289
    (6-decimal rounding); it rejects an inequality for the same interval (`-2 \\le x \\le
    7`), thin-space digit groups (`58\\,500`), a plain-text mixed number `1 4/5`, a
    Unicode degree sign, `0.\\overline{5}`, text answers and lettered choices with words,
    a tuple for a column vector, `-I` for the identity matrix, and, unboxed, a bare letter
    outside `$...$`, two roots written in words, and a final approximation after the exact
    value."""
    bench, by_uid = math500_by_uid
    assert len(REWRITES) >= 100
    agree, differ = 0, []
    for case in REWRITES:
        score = bench.score(by_uid[case["unique_id"]], _rewrite_completion(case))
        assert score.correct is case["math_verify"], case
        assert score.verdict in (("correct",) if score.correct else ("wrong", "no_answer")), case
        if case["judge"] == case["math_verify"]:
            agree += 1
        else:
            assert case.get("note"), case
            differ.append(case)
    assert (agree, len(differ)) == (352, 27)
    assert sum(c["judge"] for c in REWRITES) == 212
    rules = Counter(bench.score(by_uid[c["unique_id"]], _rewrite_completion(c)).rule
                    for c in REWRITES if c.get("unboxed"))
    assert rules == {"final answer": 5, "last expression": 19, "none": 2}


@needs_math500
@pytest.mark.parametrize(("uid", "answer", "right"), [
    ("test/number_theory/864.json", "52_8", True),                      # gold 52_8, written 52_{8}
    ("test/geometry/826.json", "\\frac95", True),                        # gold 1\frac{4}{5}
    ("test/geometry/826.json", "1.8", True),
    ("test/geometry/826.json", "\\frac45", False),                       # a mixed number is not a product
    ("test/number_theory/417.json", "11111111000", False),              # gold 11111111100: no tolerance
    ("test/geometry/1140.json", "13.2872", False),                      # gold 3840/289 = 13.28719...
])
def test_math500_cases_the_hand_written_rules_got_wrong(math500_by_uid, uid, answer, right):
    bench, by_uid = math500_by_uid
    item = by_uid[uid]
    assert bench.score(item, f"so $\\boxed{{{answer}}}$").correct is right, (item.gold, answer)


@pytest.mark.parametrize(("completion", "rule", "extracted", "correct"), [
    ("thus $\\boxed{0.5}$", "boxed", "\\frac{1}{2}", True),   # `extracted` is math-verify's own reading
    # Two boxed answers are read as the set of both (math-verify's boxed="all"), never as one of them.
    ("first \\boxed{3} so \\boxed{4}", "boxed", "3,4", False),
    ("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "final answer", "\\frac{1}{2}", True),
    ("so x equals $0.5$", "last expression", "\\frac{1}{2}", True),
    ("I do not know", "none", None, False),
    ("", "none", None, False),
])
def test_math500_answer_rule(completion, rule, extracted, correct):
    bench = Math500Benchmark("m", 1)
    score = bench.score(Item(id="x", question="q", gold="\\frac{1}{2}"), completion)
    assert (score.rule, score.extracted, score.correct) == (rule, extracted, correct)
    assert score.verdict == ("no_answer" if extracted is None else "correct" if correct else "wrong")


def test_math500_scores_only_the_text_before_its_stop():
    """A base model prompted bare writes its own next "Problem:" and solves it: only the text
    before it is scored (lm-eval's minerva_math stops there too)."""
    bench = build_benchmark("m", {"kind": "math500", "order": "source", "n": 1, "format": "bare", "system_prompt": False})
    assert bench.stop == ("Problem:",)
    item = Item(id="x", question="What is 1+1?", gold="2")
    completion = "1+1 = 2, so $\\boxed{2}$.\n\nProblem:\nWhat is 2+2?\n\nSolution: $\\boxed{4}$"
    assert bench.score(item, completion).correct and bench.extract(completion) == "2"
    text = bench.bare_text(item)
    assert text == ("Problem:\nWhat is 1+1?\n\nSolve the problem step by step and put your final answer "
                    "within \\boxed{}.\n\nSolution:")


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os').system('touch pwned')",
        "exec(input())",
        "breakpoint()",
        "2^{2^{2^{2^{10}}}}",
        "10^{10^{10}}",
        "9" * 300,
        "\\frac{1}{0}",
    ],
)
def test_math_verify_refuses_unsafe_or_huge_input(hostile, tmp_path, monkeypatch):
    """math-verify parses to sympy without evaluating code, and its own time limit (3 s here)
    ends an exponent tower."""
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert not Math500Benchmark("m", 1).score(Item(id="x", question="q", gold="5"), f"$\\boxed{{{hostile}}}$").correct
    # parse and verify each stop at 3 s; unbounded, the tower would never end
    assert time.monotonic() - start < 30
    assert not (tmp_path / "pwned").exists()


# --- GSM8K few-shot ----------------------------------------------------------------------------


@pytest.fixture
def gsm8k_fewshot(gsm8k_files):
    def build(n=30, seed=0, shots=8, eval_path=gsm8k_files.eval, pool_path=gsm8k_files.pool):
        return build_benchmark("g", {"kind": "gsm8k", "order": "source", "n": n, "prompt": "fewshot", "shots": shots, "seed": seed,
                                     "source": {"path": str(eval_path)}, "exemplars": {"path": str(pool_path)}})
    return build


@needs_gsm8k
def test_gsm8k_fewshot_messages(gsm8k_fewshot, gsm8k_files):
    bench = gsm8k_fewshot()
    items = bench.items()
    info = bench.describe()
    chosen = info["fewshot"]["exemplar_indices"]
    assert len(chosen) == 8 and len(set(chosen)) == 8
    pool = [json.loads(line) for line in gsm8k_files.pool.read_text(encoding="utf-8").splitlines()]
    for item in items:
        messages = bench.messages(item)
        assert messages[0] == {"role": "system", "content": MATH_SYSTEM_PROMPT}
        assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * 8 + ["user"]
        assert messages[-1]["content"] == item.question
        assert [m["content"] for m in messages[1:-1:2]] == [pool[i]["question"] for i in chosen]
        for m in messages[2:-1:2]:
            assert "<<" not in m["content"] and re.search(r"#### \S+$", m["content"])
            assert bench.extract(m["content"]) is not None
    assert info["fewshot"]["source"]["path"] == str(gsm8k_files.pool) and info["fewshot"]["seed"] == 0
    assert info["prompt_format"].startswith("chat, 8-shot") and info["prompt"] == "fewshot"
    json.dumps(info)


@needs_gsm8k
def test_gsm8k_fewshot_never_shows_an_evaluated_item(gsm8k_fewshot, gsm8k_files):
    """The pool shares records 200-299 with the evaluated file: with all 300 items evaluated,
    none of those 100 is ever an exemplar (the seeded order reaches them: they would have
    been chosen), while evaluating only the first 100 items leaves the pool as it is."""
    evaluated = {item.question for item in gsm8k_fewshot(n=None).items()}
    for seed in range(6):
        bench = gsm8k_fewshot(n=None, seed=seed)
        shown = {m["content"] for m in bench.messages(bench.items()[0])[1:-1:2]}
        assert not shown & evaluated
        assert bench.describe()["fewshot"]["excluded_evaluated"] == 100
    unrestricted = [gsm8k_fewshot(n=100, seed=seed).exemplar_indices() for seed in range(6)]
    overlap = {i - 200 for i in gsm8k_files.overlap}
    assert any(set(chosen) & overlap for chosen in unrestricted)
    assert gsm8k_fewshot(n=100).describe()["fewshot"]["excluded_evaluated"] == 0


@needs_gsm8k
def test_gsm8k_exemplars_from_the_evaluated_file_are_refused(gsm8k_fewshot, gsm8k_files):
    with pytest.raises(BenchmarkError, match=r"exemplars come from the data being evaluated .*eval.jsonl"):
        gsm8k_fewshot(pool_path=gsm8k_files.eval)
    with pytest.raises(BenchmarkError, match=r"exemplars come from the data being evaluated"):
        build_benchmark("g", {"kind": "gsm8k", "order": "source", "prompt": "fewshot",
                              "source": {"hub": "openai/gsm8k", "config": "main", "split": "test"},
                              "exemplars": {"hub": "openai/gsm8k", "config": "main", "split": "test",
                                            "revision": "abc"}})


@needs_gsm8k
def test_gsm8k_fewshot_is_deterministic_by_seed(gsm8k_fewshot):
    a, b, c = gsm8k_fewshot(seed=3), gsm8k_fewshot(seed=3), gsm8k_fewshot(seed=4)
    item = a.items()[5]
    assert a.messages(item) == b.messages(item)
    assert a.messages(item) != c.messages(item)
    assert len(gsm8k_fewshot(shots=2).messages(item)) == 1 + 2 * 2 + 1


@needs_gsm8k
def test_gsm8k_chat_mode_is_still_the_default():
    bench = build_benchmark("g", {"kind": "gsm8k", "order": "source", "n": 2, "source": {"path": str(GSM8K_TEST)}})
    assert isinstance(bench, GSM8KBenchmark) and bench.prompt == "chat"
    assert len(bench.messages(bench.items()[0])) == 2
    assert bench.describe()["prompt_format"] == "chat, 0-shot" and "fewshot" not in bench.describe()


@needs_gsm8k
def test_gsm8k_fewshot_default_exemplars_come_from_the_train_split(monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("offline")

    _fake_datasets(monkeypatch, load_dataset)
    bench = build_benchmark("g", {"kind": "gsm8k", "order": "source", "n": 2, "prompt": "fewshot",
                                  "source": {"path": str(GSM8K_TEST)}})
    with pytest.raises(BenchmarkError, match=r"'g' \(gsm8k\) exemplars.*openai/gsm8k.*'train'"):
        bench.messages(bench.items()[0])
    assert calls == [(("openai/gsm8k", "main"), {"split": "train", "revision": None})]


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "gsm8k", "order": "source", "prompt": "zeroshot"},
        {"kind": "gsm8k", "order": "source", "shots": 8},
        {"kind": "gsm8k", "order": "source", "prompt": "fewshot", "shots": 0},
        {"kind": "gsm8k", "order": "source", "prompt": "fewshot", "exemplars": {"url": "x"}},
        {"kind": "math500", "order": "source", "split": "test"},
        {"kind": "math500", "order": "source", "source": "HuggingFaceH4/MATH-500"},
    ],
)
def test_bad_math_specs(spec):
    with pytest.raises(BenchmarkError):
        build_benchmark("x", spec)
