"""The random models of parts 1 and 4: the papers' widths (or tiny ones), few layers."""

from __future__ import annotations

import copy
from typing import Any

# Widths of the papers' architectures (layers set separately). The sliding windows are
# shortened to 64 so that prompts of 50-80 tokens plus the generated ones cross them.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),  # Llama-2-7B
    "mistral": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000, sliding_window=64,
                    max_position_embeddings=4096),  # Mistral-7B (window 4096)
    "gemma2": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=256, vocab_size=256000, sliding_window=64,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256,
                   max_position_embeddings=8192),  # Gemma-2-2B (window 4096)
}
REAL_LAYERS = 4
TINY_VOCAB = 4096


def arch_shape(arch: str, shapes: str, layers: int | None) -> dict[str, Any]:
    if shapes == "real":
        shape = dict(REAL_SHAPES[arch], num_hidden_layers=layers or REAL_LAYERS)
    else:
        from tokenflip.models.prepare import TINY_ARCHITECTURES

        shape = dict(TINY_ARCHITECTURES[arch], vocab_size=TINY_VOCAB)
        if layers:
            shape["num_hidden_layers"] = layers
    return shape


def build_random(arch: str, shapes: str, device: str, layers: int | None = None, seed: int = 0):
    """An fp32 random model of `arch` built on `device` (bos 1, eos 2, pad 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = arch_shape(arch, shapes, layers)
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2, pad_token_id=0, **kwargs)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


def in_precision(master, precision: str):
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return copy.deepcopy(master).to(dtype).eval()


def random_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    import _common as c

    return c.prompts(None, n, seed=seed, vocab_size=vocab)


def free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def model_facts(model) -> dict[str, Any]:
    cfg = model.config
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "sliding_window": getattr(cfg, "sliding_window", None),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}
