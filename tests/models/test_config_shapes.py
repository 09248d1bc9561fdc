"""A model configuration of an unexpected shape (a `text_config` that is a string or a list, a
config.json that is no mapping) is read as saying nothing, never a crash: vLLM's head-size
check then leaves the refusal to vLLM's own message, and a context length is not known."""

from __future__ import annotations

import json

import pytest

from tokenflip.models.size import text_fields
from tokenflip.run.engines.vllm_offline.support import head_size_problem
from tokenflip.study.limits import context_length


@pytest.mark.parametrize("fields", [{"text_config": "x"}, {"text_config": [1, 2]}, {"text_config": None}, [], "x"])
def test_an_unreadable_text_config_says_nothing(fields, tmp_path):
    assert head_size_problem(fields) is None
    (tmp_path / "config.json").write_text(json.dumps(fields))
    assert context_length(tmp_path) is None


def test_a_text_config_that_is_a_mapping_is_the_models_own():
    multimodal = {"text_config": {"hidden_size": 96, "num_attention_heads": 4, "max_position_embeddings": 512}}
    assert text_fields(multimodal)["hidden_size"] == 96 and text_fields({"hidden_size": 8}) == {"hidden_size": 8}
    assert head_size_problem(multimodal) == ("its attention heads have 24 dimensions, and vLLM's CPU attention has "
                                             "kernels for 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512 only")
    assert head_size_problem({"text_config": {"hidden_size": 256, "num_attention_heads": 4}}) is None
