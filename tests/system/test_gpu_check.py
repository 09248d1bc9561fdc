"""The GPU check (perf/gpu.sh) on the CPU with tiny shapes: the same code as on a GPU, end
to end, and the transfer budget that decides whether a call of the GPU machine fits."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

# perf/ is not a package and holds modules named like the project's (storage, interventions):
# load the driver from its file rather than putting perf/ on sys.path.
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "perf" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_the_cuda_plan_fits_one_call_of_8_minutes_with_a_margin():
    """The budgets rest on what the parts took on an H200: each part's budget at least what
    it should take, all of them within the run's stop, and the run with its start within
    one call's 8 minutes; what they should take leaves a minute of it."""
    plan = gpu_check.H200_PLAN
    assert set(plan) == set(gpu_check.PARTS)
    assert all(budget >= expected for _, _, expected, budget in plan.values())
    assert sum(gpu_check.BUDGETS["cuda"].values()) <= gpu_check.TOTAL_BUDGETS["cuda"]
    start = gpu_check.H200_START[1]
    assert start + gpu_check.TOTAL_BUDGETS["cuda"] <= gpu_check.LIMIT_S == 480
    expected = start + sum(p[2] for p in plan.values())
    assert gpu_check.LIMIT_S - expected >= 60
    lines = gpu_check.budget_plan("cuda")
    assert lines[0] == "# budget plan (cuda):" and len(lines) == 1 + len(plan) + 2
    assert lines[-1] == (f"#   total at most 480 s of the call's 480 s; expected {expected} s "
                         f"(margin {480 - expected} s)")


def test_transfer_budget_counts_tracked_and_untracked_files_not_ignored_ones(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("/ignored/\n")
    (repo / "tracked.py").write_bytes(b"x" * 1000)
    _git(repo, "add", "tracked.py", ".gitignore")
    (repo / "untracked.txt").write_bytes(b"y" * 500)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_bytes(b"z" * 10_000)
    carry = repo / "ignored"
    expected_tree = 1000 + 500 + len("/ignored/\n")
    assert gpu_check.tree_bytes(repo) == expected_tree

    budget = gpu_check.transfer_budget(carry, repo, limit=expected_tree + 10_001)
    assert budget["tree_bytes"] == expected_tree
    assert budget["carry_bytes"] == 10_000
    assert budget["total_bytes"] == expected_tree + 10_000
    assert budget["fits"]
    assert not gpu_check.transfer_budget(carry, repo, limit=expected_tree + 10_000)["fits"]
    assert gpu_check.transfer_budget(repo / "absent", repo, limit=expected_tree + 1)["fits"]


def test_budget_command_refuses_a_carry_over_64_mib(tmp_path):
    carry = tmp_path / "carry"
    (carry / "wheels").mkdir(parents=True)
    with (carry / "wheels" / "huge.whl").open("wb") as fh:  # sparse: no disk used
        fh.truncate(64 * 2**20)
    cmd = [sys.executable, str(REPO / "perf" / "gpu_check.py"), "--budget", "--carry", str(carry)]
    over = subprocess.run(cmd, capture_output=True, text=True)
    assert over.returncode == 1, over.stderr
    report = json.loads(over.stdout)
    assert report["fits"] is False and report["wheel_bytes"] == 64.0
    (carry / "wheels" / "huge.whl").unlink()
    (carry / "wheels" / "small.whl").write_bytes(b"w" * 2**20)
    under = subprocess.run(cmd, capture_output=True, text=True)
    assert under.returncode == 0, under.stderr
    assert json.loads(under.stdout)["wheel_bytes"] == 1.0


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's parent may be slow to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_part_past_its_deadline_is_stopped_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(120)\n")
    rc, seconds = gpu_check.run_group([sys.executable, "-c", script], timeout=6)  # time to write the pid
    assert rc is None and 6 <= seconds < 20
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not _running(grandchild):
            break
        time.sleep(0.1)
    assert not _running(grandchild)
    rc, seconds = gpu_check.run_group([sys.executable, "-c", "pass"], timeout=30)
    assert rc == 0 and seconds < 30


def test_a_script_past_its_share_is_interrupted_in_process():
    def busy():
        end = time.time() + 30
        while time.time() < end:
            pass
        return "finished"

    t0 = time.time()
    assert gpu_check.call_with_timeout(busy, 0.5) == (None, True)
    assert time.time() - t0 < 5
    assert gpu_check.call_with_timeout(lambda: "quick", 5) == ("quick", False)


def test_the_record_check_sees_one_changed_bit(prepared_models):
    """Part 1 compares the loop's record with the statistics of each step's logits: equal
    as the loop writes it, unequal once one value moves by one unit in the last place."""
    import numpy as np
    import torch

    from tokenflip.models.prepare import load_prepared
    from tokenflip.run.decode import decode, greedy, left_pad

    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    ids, mask = left_pad([[5, 17, 230, 41], [12, 8]], tokenizer.pad_token_id)
    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits.clone())
        return greedy(logits, step)

    out = decode(model, ids, mask, max_new_tokens=4, use_cache=True, eos_token_ids=[-1],
                 pad_token_id=tokenizer.pad_token_id, select=select)
    assert gpu_check.record_matches(out.generations, seen)
    entropy = out.generations[1].entropy
    entropy[2] = float(np.nextafter(np.float32(entropy[2]), np.float32(np.inf)))
    assert not gpu_check.record_matches(out.generations, seen)


@pytest.mark.slow
def test_gpu_check_passes_end_to_end_on_the_cpu(tmp_path, prepared_models):
    # The pipeline's model as the GPU run gets it: a carried local directory.
    carry = tmp_path / "carry"
    (carry / "models").mkdir(parents=True)
    (carry / "models" / "tiny-llama").symlink_to(prepared_models("llama"))
    out = tmp_path / "out"
    env = dict(os.environ, DEVICE="cpu", PYTHON=sys.executable, OUT=str(out), CARRY=str(carry),
               OMP_NUM_THREADS="1")
    # The parts' time budgets are for a GPU machine of one's own: on two shared cores they get
    # three times as much (this checks what the parts find, not how fast).
    proc = subprocess.run(["bash", str(REPO / "perf" / "gpu.sh"), "--budget-scale", "3"], env=env,
                          capture_output=True, text=True, timeout=3 * gpu_check.TOTAL_BUDGETS["cpu"] + 300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "nothing to install" in proc.stdout  # this environment already has the pinned versions
    result = json.loads((out / "gpu-check.json").read_text())
    parts = result["parts"]
    assert {name: p["status"] for name, p in parts.items()} == {name: "pass" for name in gpu_check.PARTS}
    assert result["passed"] is True
    assert result["environment"]["transformers"] == gpu_check.locked_versions(["transformers"])["transformers"]

    # 1. Every combination, bitwise: tokens and each step's fp32 logits.
    checks = parts["decode_equals_generate"]["checks"]
    combos = {(c["arch"], c["precision"], c["cache"], c["batch_size"]) for c in checks}
    assert combos == set(itertools.product(["llama", "mistral", "gemma2"], ["fp16", "bf16"], [True, False], [1, 4]))
    assert all(c["tokens_equal"] and c["logits_equal"] and c["max_abs_logit_diff"] == 0.0 for c in checks)
    assert all(c["record_equal"] for c in checks)
    assert set(parts["decode_equals_generate"]["record_graph_use"]) == {"eager: not CUDA"}  # on CUDA: "graph"
    models = parts["decode_equals_generate"]["models"]
    for arch in ("mistral", "gemma2"):  # the sliding window is crossed
        window = models[arch]["sliding_window"]
        assert all(c["prompt_tokens"] + c["steps"] > window for c in checks if c["arch"] == arch)

    # 2. The pipeline ran to its report; each cell's digests are recorded.
    pipeline = parts["pipeline"]["checks"][0]
    assert pipeline["returncode"] == 0 and pipeline["report_bytes"] > 0
    assert sorted(pipeline["cells"]) == ["bf16-off-bs1-greedy-none", "bf16-on-bs1-greedy-none"]
    for cell in pipeline["cells"].values():
        assert len(cell["token_stream_sha256"]) == 64 and len(cell["logits_sha256"]) == 64
    assert [p["axis"] for p in pipeline["pairs"]] == ["cache"] and pipeline["pairs"][0]["status"] == "done"
    assert (out / "gpu-check-report.html").read_text().lstrip().lower().startswith("<!doctype html")

    # 3. The performance scripts' figures, parsed from their output.
    perf = {c["name"]: c["figures"] for c in parts["perf"]["checks"]}
    for bs in ("bs1", "bs8"):
        assert perf["decode_vs_generate"][bs]["tokens_identical"]
        assert set(perf["decode_vs_generate"][bs]["tok_s_wall"]) == {"generate", "decode", "decode-norecord"}
        assert perf["decode_vs_generate"][bs]["decode_over_generate"] > 0
        host_ms = perf["decode_vs_generate"][bs]["host_ms_per_step_outside_forward"]
        assert set(host_ms) == {"generate", "decode", "decode-norecord"} and all(v > 0 for v in host_ms.values())
        # 4 new tokens: one synchronisation per step, a fixed few per batch; generate() has more
        syncs = perf["decode_vs_generate"][bs]["syncs_per_step_outside_forward"]
        assert set(syncs) == set(host_ms) and 1 <= syncs["decode"] <= 1 + 3 / 4 and syncs["decode"] < syncs["generate"]
        # the record's operations a step, eagerly and as run (on CUDA: its graph's 4 copies and a replay)
        assert perf["decode_vs_generate"][bs]["record_launches_per_step"] == {"eager": 10, "as_run": 10,
                                                                               "way": "eager: not CUDA"}
    assert {"C_gated_pct", "C_ungated_pct", "global_fp32_pct"} <= set(perf["interventions"])
    assert set(perf["cache_off_scaling"]["per_new_tokens"]) == {"4", "8"}
    assert "off_step_ms_per_context_token" in perf["cache_off_scaling"]

    # 4. Divergences per architecture; bf16 and fp16 never give the same logits.
    divergence = {c["name"]: c for c in parts["divergence"]["checks"]}
    assert set(divergence) == {"llama", "mistral", "gemma2"}
    for arch in divergence.values():
        assert set(arch["pairs"]) == set(gpu_check.DIVERGENCE_PAIRS)
        assert arch["pairs"]["bf16_vs_fp16/cache_on"]["step0_max_abs_logit_diff"] > 0
    assert [s["name"] for s in parts["divergence"]["skipped"]] == ["cpu_vs_cuda"]

    log = (out / "gpu-check.log").read_text()
    assert "all parts passed: True" in log
    assert log.index("# budget plan (cpu, x3):") < log.index("== part decode_equals_generate")
    assert result["plan"] == gpu_check.budget_plan("cpu", 3)
