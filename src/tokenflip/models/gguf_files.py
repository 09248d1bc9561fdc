"""A model prepared from a GGUF file through transformers' own loader, its file parsed once
(`read_once`) and its quantizer's leftovers dropped (`forget_quantization`)."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any


@contextlib.contextmanager
def read_once():
    """transformers parses a GGUF file three times to prepare one model (for its config, its
    weights and its tokenizer), and builds gguf's tensor-name map once per module (397 times
    for SmolLM2-135M): most of a conversion's CPU time. Within this block each is made once
    per file, and per architecture and block count. Both are read-only, so the model and
    tokenizer built from them are the library's own: the prepared SmolLM2's digests are
    pinned in tests/models, made by transformers without this block."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, Any] = {}

    def read_once(path, mode="r"):
        key = (os.path.realpath(path), os.stat(path).st_mtime_ns, mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def forget_quantization(model):
    """transformers dequantises GGUF tensors to plain fp32 on load but keeps a GGUF
    quantizer attached, which refuses to save. The weights are ordinary tensors: drop it."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    return model
