"""Config loading and validation: every mistake is reported before any job runs,
naming the file, the key and the value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml

from .plan import COMPARABLE_AXES, EXTRA_AXES

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (plain YAML keeps the last one silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{node.start_mark.name}: duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                f"(first at line {seen[key] + 1})")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open() as fh:
            data = yaml.load(fh, Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


_ON_OFF_AXES = ("cache", "deterministic")


def _normalise(config: dict[str, Any]) -> dict[str, Any]:
    """YAML 1.1 reads bare on/off as booleans; the on/off axes mean the strings."""
    config = copy.deepcopy(config)
    as_word = {True: "on", False: "off"}
    for grid in config.get("grids", []) or []:
        for axis in _ON_OFF_AXES:
            if isinstance(grid, dict) and isinstance(grid.get(axis), list):
                grid[axis] = [as_word.get(v, v) if isinstance(v, bool) else v for v in grid[axis]]
    for comp in config.get("comparisons", []) or []:
        if isinstance(comp, dict) and comp.get("axis") in _ON_OFF_AXES:
            for side in ("a", "b"):
                if isinstance(comp.get(side), bool):
                    comp[side] = as_word[comp[side]]
    return config


def _apply_defaults(config: dict[str, Any], schema: dict[str, Any]) -> None:
    for key, sub in schema.get("properties", {}).items():
        if "default" in sub and key not in config:
            config[key] = copy.deepcopy(sub["default"])
        if isinstance(config.get(key), dict) and sub.get("type") == "object":
            _apply_defaults(config[key], sub)


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def validate(config: dict[str, Any], source: str = "config", schema_path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """Return the normalised config with defaults filled in, or raise ConfigError listing
    every problem as `source: key.path: message`."""
    schema = yaml.safe_load(schema_path.read_text())
    config = _normalise(config)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [f"{source}: {_where(e)}: {_describe(e)}" for e in _leaf_errors(errors)]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    _apply_defaults(config, schema)
    problems = list(_semantic_problems(config))
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(f"{source}: {p}" for p in problems))
    return config


def _leaf_errors(errors: Iterable[jsonschema.ValidationError]) -> list[jsonschema.ValidationError]:
    out = []
    for e in errors:
        if e.context:
            out.extend(_leaf_errors(e.context))
        else:
            out.append(e)
    seen, unique = set(), []
    for e in out:
        key = (_where(e), e.message)
        if key not in seen:
            seen.add(key)
            unique.append(e)
    return unique


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "pattern":
        return (f"{error.instance!r} contains characters that are not allowed in file names "
                f"(allowed: {error.validator_value})")
    if error.validator == "enum":
        return f"{error.instance!r} is not one of {error.validator_value}"
    if error.validator == "minimum":
        return f"{error.instance!r} is below the minimum {error.validator_value}"
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key(s)")
    return error.message


def _semantic_problems(config: dict[str, Any]):
    """Cross-references the schema cannot express."""
    for i, grid in enumerate(config["grids"]):
        for axis, block, default in (("decoding", "decoding", "greedy"),
                                     ("intervention", "interventions", "none")):
            for label in grid.get(axis, [default]):
                if label not in config[block]:
                    yield (f"grids.{i}.{axis}: {label!r} is not defined under '{block}' "
                           f"(defined: {sorted(config[block])})")
    defaults = {"decoding": "greedy", "intervention": "none", **EXTRA_AXES}
    values: dict[str, set] = {axis: set() for axis in COMPARABLE_AXES}
    for i, grid in enumerate(config["grids"]):
        for axis in COMPARABLE_AXES:
            values[axis].update(v if axis == "batch_size" else str(v)
                                for v in grid.get(axis, [defaults.get(axis)]))
        for key, block in (("models", "models"), ("benchmarks", "benchmarks")):
            for name in grid.get(key, []):
                if name not in config[block]:
                    yield f"grids.{i}.{key}: {name!r} is not defined under '{block}' (defined: {sorted(config[block])})"
    for i, comp in enumerate(config["comparisons"]):
        axis = comp["axis"]
        if comp["a"] == comp["b"]:
            yield f"comparisons.{i}: a and b are both {comp['a']!r}; a comparison needs two values"
        for side in ("a", "b"):
            v = comp[side]
            v = int(v) if axis == "batch_size" and str(v).isdigit() else v if axis == "batch_size" else str(v)
            if v not in values[axis]:
                yield (f"comparisons.{i}.{side}: {comp[side]!r} is not a value of axis '{axis}' "
                       f"in any grid (values: {sorted(map(str, values[axis]))})")


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a config file (the entry point outside Snakemake)."""
    return validate(read_yaml(path), source=str(path))
