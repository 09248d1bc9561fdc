"""How large a model is, read from its checkpoint's configuration, not from its name.

A name says "OLMoE-1B-7B" (7B stored, about 1.3B computed per token) or "gemma-2-2b"
(2.6B): what a step costs follows from the configuration. The configuration is read, in
this order, from the prepared model (`resources/models/<name>/config.json`), a local
directory the config names, the Hugging Face cache (never the network: planning does not
reach the hub), the GGUF file of a `gguf-package` model, a random model's architecture, or
the published configuration of the paper configs' checkpoints (below, so that they are
priced before anything is downloaded); only when none is at hand is the size in the name
taken, and the result says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The shapes of the paper configs' checkpoints, from each one's config.json on the hub: what
# a step costs depends on them, and planning runs before anything is downloaded.
_Q = dict(model_type="qwen2", vocab_size=151936)
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": dict(model_type="llama", hidden_size=4096, intermediate_size=11008,
                                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                     vocab_size=32000),
    "mistralai/Mistral-7B-v0.1": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      vocab_size=32000),
    "mistralai/Mistral-7B-v0.3": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      vocab_size=32768),
    "google/gemma-2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": dict(model_type="llama", hidden_size=2048, intermediate_size=5632,
                                               num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                               vocab_size=32000),
    "meta-llama/Llama-3.2-3B-Instruct": dict(model_type="llama", hidden_size=3072, intermediate_size=8192,
                                             num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                                             vocab_size=128256, tie_word_embeddings=True),
    "allenai/OLMoE-1B-7B-0924": dict(model_type="olmoe", hidden_size=2048, intermediate_size=1024,
                                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                                     num_experts=64, num_experts_per_tok=8, vocab_size=50304),
    "Qwen/Qwen2.5-3B-Instruct": dict(_Q, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                     num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(_Q, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(_Q, hidden_size=1536, intermediate_size=8960,
                                                      num_hidden_layers=28, num_attention_heads=12,
                                                      num_key_value_heads=2, tie_word_embeddings=False),
    "Qwen/Qwen2.5-7B-Instruct": dict(_Q, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": dict(_Q, hidden_size=3584, intermediate_size=18944,
                                                    num_hidden_layers=28, num_attention_heads=28,
                                                    num_key_value_heads=4, vocab_size=152064,
                                                    tie_word_embeddings=False),
}

_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)([bBmM])(?![a-zA-Z0-9])")


@dataclass(frozen=True)
class ModelSize:
    """Parameters stored (`total`) and computed per token (`active`: a mixture of experts
    routes each token through `num_experts_per_tok` of its experts), the layers (what a
    launch-bound step scales with) and the LM head's parameters (what the FP32-head
    interventions recompute)."""

    total: float
    active: float
    layers: int | None
    head: float | None
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"parameters": self.total, "active_parameters": self.active, "layers": self.layers,
                "head_parameters": self.head, "from": self.source}


def text_fields(fields: Any) -> dict[str, Any]:
    """The fields of a configuration's text model: its `text_config` where that is a mapping
    (a multimodal model), else its own; {} where the configuration is no mapping at all."""
    if not isinstance(fields, dict):
        return {}
    inner = fields.get("text_config")
    return inner if isinstance(inner, dict) else fields


def head_size(fields: dict[str, Any]) -> int:
    """The attention head's size of a configuration's fields: `head_dim` where the architecture
    sets its own (gemma-2-2b: 256, not 2304 / 8), else hidden_size / num_attention_heads.
    Raises KeyError, TypeError or ZeroDivisionError on fields that do not say it."""
    return int(fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"])


def size_in_name(name: str) -> float | None:
    """Parameters named in a model id ("TinyLlama-1.1B" -> 1.1e9; the largest if several)."""
    sizes = [float(n) * (1e9 if unit in "bB" else 1e6) for n, unit in _SIZE.findall(name)]
    return max(sizes) if sizes else None


def _experts(config) -> tuple[int, int] | None:
    """(experts per layer, experts each token goes through), for a mixture of experts."""
    n = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    k = getattr(config, "num_experts_per_tok", None)
    return (int(n), int(k)) if n and k else None


def size_of_config(config, source: str) -> ModelSize:
    """Count the parameters of a transformers configuration exactly, building the model on
    the `meta` device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = expert = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name or name.endswith(".experts"):
            expert += p.numel()
    active = float(total)
    if (moe := _experts(config)) and expert:
        n, k = moe
        active = total - expert * (1 - k / n)
    text = config.get_text_config(decoder=True)
    head = float(text.vocab_size * text.hidden_size)
    return ModelSize(float(total), active, int(text.num_hidden_layers), head, source)


def _config_file(name: str, spec: dict[str, Any], models_dir: Path) -> tuple[Path | None, str]:
    prepared = models_dir / name / "config.json"
    if prepared.is_file():
        return prepared, "prepared model's config"
    if spec.get("source") != "hf":
        return None, ""
    local = Path(spec["id"]) / "config.json"
    if local.is_file():
        return local, "the local checkpoint's config"
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec["id"], "config.json", revision=spec.get("revision"))
    except Exception:  # noqa: BLE001 - an id the cache cannot hold is simply not cached
        cached = None
    if isinstance(cached, str):
        return Path(cached), "the Hugging Face cache's config"
    return None, ""


def model_size(name: str, spec: dict[str, Any], models_dir: Path) -> ModelSize | None:
    """The size of config model `name` (None when nothing says it)."""
    from transformers import AutoConfig

    path, source = _config_file(name, spec, models_dir)
    try:
        if path is not None:
            raw = json.loads(path.read_text())
            config = AutoConfig.for_model(raw.pop("model_type"), **raw)
            return size_of_config(config, source)
        if spec.get("source") == "gguf-package":
            from tokenflip.models.prepare import package_file

            gguf = package_file(spec["package"], spec["file"])
            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            return size_of_config(config, "the GGUF file's metadata")
        if spec.get("source") == "random":
            from tokenflip.models.prepare import build_model

            model, _ = build_model(spec)
            return size_of_config(model.config, "random model's configuration")
        if spec.get("id") in PUBLISHED_CONFIGS:
            raw = dict(PUBLISHED_CONFIGS[spec["id"]])
            return size_of_config(AutoConfig.for_model(raw.pop("model_type"), **raw),
                                  "its published configuration (not downloaded)")
    except Exception:  # noqa: BLE001 - a config this cannot read falls back to the name, which says so
        pass
    for label in (spec.get("id"), spec.get("file"), name):
        if label and (n := size_in_name(str(label))):
            return ModelSize(n, n, None, None, "size in its name (no configuration at hand)")
    return None


def random_model_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The transformers config fields a random model is built from: its architecture's
    defaults, then the config's overrides (as `models.prepare.build_model` merges them)."""
    from tokenflip.models.prepare import TINY_ARCHITECTURES  # imports torch: only for configs with a random model

    return {**TINY_ARCHITECTURES[spec["architecture"]], **spec.get("overrides", {})}


def context_length(model_dir: str | Path) -> int | None:
    """A prepared model's context (max_position_embeddings of its config.json, or of its
    text config), None where it names none."""
    path = Path(model_dir) / "config.json"
    from tokenflip.models.served_tokenizer import FILE

    served = Path(model_dir) / FILE
    if not path.is_file() and served.is_file():  # the model length the server's model list names
        value = json.loads(served.read_text())["info"].get("max_model_len")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
    if not path.is_file():
        return None
    fields = json.loads(path.read_text())
    value = (fields.get("max_position_embeddings") if isinstance(fields, dict) else None) \
        or text_fields(fields).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
