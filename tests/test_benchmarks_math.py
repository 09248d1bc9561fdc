"""Tests for MATH-500 (boxed extraction, normalisation, sympy equivalence and which rule
decided), GSM8K's few-shot mode, and the shared data sources."""

from __future__ import annotations

import json
import re
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pytest

from tokenflip.benchmarks import (
    MATH_SYSTEM_PROMPT,
    BenchmarkError,
    GSM8KBenchmark,
    Item,
    Math500Benchmark,
    build_benchmark,
    last_boxed,
    math_equal,
    normalize_math,
)
from tokenflip.benchmarks.math_equiv import RULES, to_sympy
from tokenflip.benchmarks.math500 import BOXED_SYSTEM_PROMPT

from conftest import SHARED_DATA as DATA  # noqa: E402
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
    bench = build_benchmark("m", {"kind": "math500", "source": {"path": str(MATH500)}})
    items = bench.items()
    assert len(items) == 500
    ids = [i.id for i in items]
    assert len(set(ids)) == 500 and all(re.fullmatch(r"math500-[A-Za-z0-9-]+", i) for i in ids)
    assert ids[0] == "math500-precalculus-807"
    verdicts = [bench.judge(item, item.solution) for item in items]
    rules = Counter(v.rule for v in verdicts if v.equal)
    assert sum(v.equal for v in verdicts) >= 497, [(i.id, bench.extract(i.solution), i.gold)
                                                    for i, v in zip(items, verdicts) if not v]
    assert rules["exact"] >= 490 and set(rules) <= set(RULES)
    assert all(bench.is_correct(item, f"so the answer is $\\boxed{{{item.gold}}}$.") for item in items)


@needs_math500
def test_math500_prompt_and_describe():
    bench = build_benchmark("m", {"kind": "math500", "n": 3, "source": {"path": str(MATH500)}})
    item = bench.items()[0]
    assert bench.messages(item) == [{"role": "system", "content": BOXED_SYSTEM_PROMPT},
                                    {"role": "user", "content": item.question}]
    info = bench.describe()
    assert info["n"] == 3 and info["prompt_format"] == "chat, 0-shot"
    assert "boxed" in info["scorer"] and "sympy" in info["scorer"] and info["rules"] == list(RULES)
    assert info["source"]["path"] == str(MATH500) and len(info["source"]["sha256"]) == 64
    json.dumps(info)


@needs_math500
def test_math500_from_parquet_and_json(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()[:20]]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "m.parquet")
    (tmp_path / "m.json").write_text(json.dumps(records))
    expected = build_benchmark("m", {"kind": "math500", "n": 20, "source": {"path": str(MATH500)}}).items()
    for name in ("m.parquet", "m.json"):
        assert build_benchmark("m", {"kind": "math500", "source": {"path": str(tmp_path / name)}}).items() == expected


def test_math500_hub_default_and_offline_error(monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return [{"problem": "1+1?", "answer": "2", "solution": "$\\boxed{2}$", "unique_id": "test/algebra/1.json"}]

    _fake_datasets(monkeypatch, load_dataset)
    bench = build_benchmark("m", {"kind": "math500", "source": {"revision": "r1"}})
    assert [i.id for i in bench.items()] == ["math500-algebra-1"]
    assert calls == [(("HuggingFaceH4/MATH-500",), {"split": "test", "revision": "r1"})]

    def offline(*args, **kwargs):
        raise FileNotFoundError("not cached")

    _fake_datasets(monkeypatch, offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BenchmarkError, match=r"'m' \(math500\).*HuggingFaceH4/MATH-500@unpinned.*HF_HUB_OFFLINE"):
        build_benchmark("m", {"kind": "math500"}).items()


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


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("864 \\mbox{ inches}^2", "864"),
        ("15\\text{ cm}^2", "15"),
        ("10 degrees", "10"),
        ("\\$18.90", "18.90"),
        ("25\\%", "25"),
        ("1,\\!000", "1000"),
        ("1{,}000{,}000", "1000000"),
        ("x = 5", "5"),
        ("\\theta = \\frac{\\pi}{3}", "\\frac{\\pi}{3}"),
        ("5.", "5"),
        (".5", "0.5"),
        ("\\text{(C)}", "C"),
        ("\\text{Evelyn}", "Evelyn"),
        ("\\textbf{(A) } 4", "(A)4"),
        ("a \\, b", "ab"),
    ],
)
def test_normalize_math(raw, normal):
    assert normalize_math(raw) == normal


@pytest.mark.parametrize(
    ("predicted", "gold", "equal", "rule"),
    [
        ("\\frac{1}{2}", "\\frac{1}{2}", True, "exact"),
        ("\\dfrac{1}{2}", "\\frac12", True, "normalized"),
        ("90^\\circ", "90", True, "normalized"),
        ("864 \\mbox{ inches}^2", "864", True, "normalized"),
        ("2.50", "2.5", True, "numeric"),
        ("1,000", "1000.0", True, "numeric"),
        ("2.4", "2.5", False, "numeric"),
        ("0.5", "\\frac{1}{2}", True, "sympy"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True, "sympy"),
        ("x^2+2x+1", "(x+1)^2", True, "sympy"),
        ("2^{10}", "1024", True, "sympy"),
        ("\\sqrt[3]{8}", "2", True, "sympy"),
        ("3+4i", "4i+3", True, "sympy"),
        ("\\frac{1}{3}", "0.333", False, "sympy"),
        ("x+1", "x+2", False, "sympy"),
        ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)", True, "elementwise"),
        ("2, -1", "-1, 2", True, "elementwise"),
        ("(2,-1)", "(-1,2)", False, "elementwise"),
        ("[1,2)", "(1,2)", False, "elementwise"),
        ("ab", "ba", False, "normalized"),
        ("Monday", "Tuesday", False, "normalized"),
        ("\\mathcal{A}", "5", False, "unparsed"),
        (None, "1", False, "no-answer"),
        ("", "1", False, "no-answer"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True, "normalized"),
    ],
)
def test_math_equal_reports_rule(predicted, gold, equal, rule):
    verdict = math_equal(predicted, gold)
    assert (verdict.equal, verdict.rule) == (equal, rule)
    assert bool(verdict) is equal


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
def test_sympy_refuses_unsafe_or_huge_input(hostile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    verdict = math_equal(hostile, "5")
    assert not verdict.equal
    assert time.monotonic() - start < 3
    assert not (tmp_path / "pwned").exists()


def test_to_sympy_whitelist():
    import sympy

    assert to_sympy("\\frac{\\pi}{2}") == sympy.pi / 2
    assert to_sympy("2\\sqrt{2}") == 2 * sympy.sqrt(2)
    assert to_sympy("os.system") is None
    assert to_sympy("\\unknowncommand{1}") is None


def test_math500_judge_says_which_rule():
    bench = Math500Benchmark("m", 1)
    item = Item(id="x", question="q", gold="\\frac{1}{2}")
    assert bench.judge(item, "thus \\boxed{0.5}").rule == "sympy"
    assert bench.judge(item, "thus \\boxed{\\dfrac{1}{2}}.").rule == "normalized"
    assert bench.judge(item, "thus 1/2").rule == "no-answer"
    assert bench.extract("\\boxed{3} so \\boxed{4}") == "4"


# --- GSM8K few-shot ----------------------------------------------------------------------------


def gsm8k_fewshot(n=30, seed=0, shots=8):
    return build_benchmark("g", {"kind": "gsm8k", "n": n, "prompt": "fewshot", "shots": shots, "seed": seed,
                                 "source": {"path": str(GSM8K_TEST)}, "exemplars": {"path": str(GSM8K_TEST)}})


@needs_gsm8k
def test_gsm8k_fewshot_messages_and_exclusion():
    bench = gsm8k_fewshot()
    items = bench.items()
    info = bench.describe()
    default = info["fewshot"]["exemplar_indices"]
    assert len(default) == 8 and len(set(default)) == 8
    pool = [json.loads(line) for line in GSM8K_TEST.read_text(encoding="utf-8").splitlines()]
    for item in items:
        messages = bench.messages(item)
        assert messages[0] == {"role": "system", "content": MATH_SYSTEM_PROMPT}
        assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * 8 + ["user"]
        assert messages[-1]["content"] == item.question
        shown = [m["content"] for m in messages[1:-1:2]]
        assert item.question not in shown
        for m in messages[2:-1:2]:
            assert "<<" not in m["content"] and re.search(r"#### \S+$", m["content"])
            assert bench.extract(m["content"]) is not None
    inside = [i for i in range(len(pool)) if f"gsm8k-{i:04d}" in {it.id for it in items} and i in default]
    for index in inside:
        item_id = f"gsm8k-{index:04d}"
        chosen = info["fewshot"]["substitutions"][item_id]
        assert index not in chosen and len(chosen) == 8
    assert set(info["fewshot"]["substitutions"]) == {f"gsm8k-{i:04d}" for i in inside}
    assert info["fewshot"]["source"]["path"] == str(GSM8K_TEST) and info["fewshot"]["seed"] == 0
    assert info["prompt_format"].startswith("chat, 8-shot") and info["prompt"] == "fewshot"
    json.dumps(info)


@needs_gsm8k
def test_gsm8k_fewshot_item_excluded_from_own_exemplars_everywhere():
    bench = gsm8k_fewshot(n=None)
    default = bench.describe()["fewshot"]["exemplar_indices"]
    items = bench.items()
    for index in default:
        own = items[index]
        shown = [m["content"] for m in bench.messages(own)[1:-1:2]]
        assert own.question not in shown and len(shown) == 8
    assert set(bench.describe()["fewshot"]["substitutions"]) == {f"gsm8k-{i:04d}" for i in default}


@needs_gsm8k
def test_gsm8k_fewshot_is_deterministic_by_seed():
    a, b, c = gsm8k_fewshot(seed=3), gsm8k_fewshot(seed=3), gsm8k_fewshot(seed=4)
    item = a.items()[5]
    assert a.messages(item) == b.messages(item)
    assert a.messages(item) != c.messages(item)
    assert len(gsm8k_fewshot(shots=2).messages(item)) == 1 + 2 * 2 + 1


@needs_gsm8k
def test_gsm8k_chat_mode_is_still_the_default():
    bench = build_benchmark("g", {"kind": "gsm8k", "n": 2, "source": {"path": str(GSM8K_TEST)}})
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
    bench = build_benchmark("g", {"kind": "gsm8k", "n": 2, "prompt": "fewshot",
                                  "source": {"path": str(GSM8K_TEST)}})
    with pytest.raises(BenchmarkError, match=r"'g' \(gsm8k\) exemplars.*openai/gsm8k.*'train'"):
        bench.messages(bench.items()[0])
    assert calls == [(("openai/gsm8k", "main"), {"split": "train", "revision": None})]


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "gsm8k", "prompt": "zeroshot"},
        {"kind": "gsm8k", "shots": 8},
        {"kind": "gsm8k", "prompt": "fewshot", "shots": 0},
        {"kind": "gsm8k", "prompt": "fewshot", "exemplars": {"url": "x"}},
        {"kind": "math500", "split": "test"},
        {"kind": "math500", "source": "HuggingFaceH4/MATH-500"},
    ],
)
def test_bad_math_specs(spec):
    with pytest.raises(BenchmarkError):
        build_benchmark("x", spec)
