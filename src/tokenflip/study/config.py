"""Config loading and validation: every mistake is reported before any job runs,
naming the file, the key and the value."""

from __future__ import annotations

import copy
import functools
import importlib.resources
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml

from tokenflip.core.axes import AXES, GRID_DEFAULTS, ON_OFF_AXES, REQUIRED_AXES, axis_value, grid_schema
from tokenflip.core.excerpt import excerpt, redacted
from tokenflip.core.inputs import kernel_file, yaml_problem
from tokenflip.core.literals import literal_problems
from tokenflip.core.registry import kinds_schema
from tokenflip.models import hub
from tokenflip.run import engines
from tokenflip.study import checks, limits, rounds

# Shipped inside the package, so that any installation (not only a checkout) validates.
SCHEMA_RESOURCE = ("tokenflip.study", "schemas/config.schema.yaml")
DEFAULT_CONFIG = "config/config.yaml"


class ConfigError(ValueError):
    """A config, or a command's arguments, that cannot run (the message names what and why)."""


# JSON Schema counts 6.0 as an integer; a job does not (range(6.0) fails), so neither do we.
_STRICT_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_STRICT_TYPES)
# Every seed is handed to torch.manual_seed and stored as a 64-bit signed integer (numpy's
# seed takes it modulo 2**32: runtime.seed_everything).
SEED_MAXIMUM = 2**63 - 1


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (plain YAML keeps the last one silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{node.start_mark.name}: duplicate key {excerpt(key)} at line {key_node.start_mark.line + 1} "
                f"(first at line {seen[key] + 1})")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> dict[str, Any]:
    if tree := kernel_file(path := Path(path)):
        raise ConfigError(f"{path}: a file of the kernel's {tree} tree, not a config")
    try:
        with path.open() as fh:
            data = yaml.load(fh, Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _normalise(config: dict[str, Any]) -> dict[str, Any]:
    """YAML 1.1 reads bare on/off as booleans; the on/off axes mean the strings."""
    config = copy.deepcopy(config)
    as_word = {True: "on", False: "off"}
    for grid in config.get("grids", []) or []:
        for axis in ON_OFF_AXES:
            if isinstance(grid, dict) and isinstance(grid.get(axis), list):
                grid[axis] = [as_word.get(v, v) if isinstance(v, bool) else v for v in grid[axis]]
    for comp in config.get("comparisons", []) or []:
        if isinstance(comp, dict) and comp.get("axis") in ON_OFF_AXES:
            for side in ("a", "b"):
                if isinstance(comp.get(side), bool):
                    comp[side] = as_word[comp[side]]
    return config


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    package, name = SCHEMA_RESOURCE
    return importlib.resources.files(package).joinpath(name).read_text()


def schema() -> dict[str, Any]:
    """The config schema: the shipped YAML completed from the registries (benchmark kinds,
    intervention kinds, probes and axes), so the enums never drift from the code."""
    from tokenflip.run.benchmarks import BENCHMARKS, COMMON_SPEC_SCHEMA
    from tokenflip.run.engines.endpoint.engine import SERVER_KINDS
    from tokenflip.run.interventions import INTERVENTIONS
    from tokenflip.run.probes import COMMON_OPTIONS, PROBES

    full = yaml.safe_load(_schema_text())
    props = full["properties"]
    props["benchmarks"]["additionalProperties"] = kinds_schema(
        {kind: cls.spec_schema for kind, cls in BENCHMARKS.items()}, COMMON_SPEC_SCHEMA)
    props["interventions"]["additionalProperties"] = kinds_schema(
        {name: entry.options for name, entry in INTERVENTIONS.items()}, {"kind": {"type": "string"}})
    props["probes"]["properties"] = {
        name: {"type": "object", "additionalProperties": False, "description": probe.summary,
               "properties": {**COMMON_OPTIONS, **probe.options}}
        for name, probe in PROBES.items()}
    props["comparisons"]["items"]["properties"]["axis"] = {"enum": list(AXES)}
    props["endpoints"]["additionalProperties"]["properties"]["server"]["enum"] = list(SERVER_KINDS)
    grid = props["grids"]["items"]
    grid["required"] = list(REQUIRED_AXES)
    grid_axes = grid["properties"]
    grid_axes.update({name: grid_schema(name) for name in AXES})
    # An engine of the registry, or an endpoint of the config's own (checked in `_undefined_names`).
    grid_axes["engine"]["items"] = {"$ref": "#/$defs/label"}
    # A comparison's sides take exactly what a grid takes for the axis (1 and "1" are not two
    # threads values: an integer axis refuses the string), so every value has one form.
    props["comparisons"]["items"]["allOf"] = [
        {"if": {"properties": {"axis": {"const": axis}}},
         "then": {"properties": {"a": grid_axes[axis]["items"], "b": grid_axes[axis]["items"]}}}
        for axis in AXES]
    _bound_seeds(full)
    return full


def _bound_seeds(node: Any) -> None:
    """Give every integer `seed` key of the schema (run, model, benchmark kinds, wherever a
    registry declares one) the bound torch takes."""
    if isinstance(node, dict):
        seed = node.get("properties", {}).get("seed") if isinstance(node.get("properties"), dict) else None
        if isinstance(seed, dict) and seed.get("type") == "integer":
            seed["maximum"] = min(seed.get("maximum", SEED_MAXIMUM), SEED_MAXIMUM)
        for value in node.values():
            _bound_seeds(value)
    elif isinstance(node, list):
        for value in node:
            _bound_seeds(value)


def apply_defaults(instance: Any, schema: dict[str, Any]) -> None:
    """Fill in every `default` of the schema, in place, inside maps and lists too (a map's
    entries through `additionalProperties`, a kind's options through a matching if/then),
    so that a job's settings record every value it used and no code restates a default.
    A default is applied only where its parent exists (an optional block stays absent
    unless it has a default itself)."""
    if isinstance(instance, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in instance and "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                apply_defaults(instance[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in instance.items():
                if key not in schema.get("properties", {}):
                    apply_defaults(value, extra)
        for branch in schema.get("allOf", []):
            if "if" in branch and Validator(branch["if"]).is_valid(instance):
                apply_defaults(instance, branch.get("then", {}))
            elif "if" not in branch:
                apply_defaults(instance, branch)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for value in instance:
            apply_defaults(value, schema["items"])


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def validate(config: dict[str, Any], source: str = "config", check_data: bool = True) -> dict[str, Any]:
    """Return the normalised config with defaults filled in, or raise ConfigError listing
    every problem as `source: key.path: message`. With `check_data`, every benchmark is
    also built and its items counted (no model needed), so that a bad benchmark entry or
    data file fails here, before any job runs, not in a generation job's log."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    full_schema = schema()
    config = _normalise(config)
    literals = list(literal_problems(config))
    if literals:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(f"{source}: {p}" for p in literals))
    validator = Validator(full_schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [f"{source}: {_where(e)}: {_describe(e)}" for e in _leaf_errors(errors)]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    apply_defaults(config, full_schema)
    _apply_stop_defaults(config)
    problems = list(_resolve_served_models(config)) or list(_semantic_problems(config))
    if check_data and not problems:
        problems = list(_benchmark_problems(config))
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(f"{source}: {p}" for p in problems))
    return config


def _resolve_served_models(config: dict[str, Any]):
    """Fill each `source: server` model's `served_by` from the endpoint it names (the URL,
    model, server kind and key variable its tokenizer is asked at), so that its preparation
    and every cell record where the tokenizer came from, and a changed endpoint prepares it
    again."""
    endpoints = config.get("endpoints", {})
    for name, spec in config["models"].items():
        if spec.get("source") != "server":
            continue
        endpoint = endpoints.get(spec["endpoint"])
        if endpoint is None:
            yield (f"models.{name}.endpoint: {spec['endpoint']!r} is not defined under 'endpoints' (defined: "
                   f"{sorted(endpoints)})")
            continue
        spec["served_by"] = served_by(endpoint)


def served_by(endpoint: dict[str, Any]) -> dict[str, Any]:
    """What of an endpoint entry says where its server's tokenizer is (not its timeouts)."""
    return {key: endpoint[key] for key in ("url", "model", "server", "api_key_env") if endpoint.get(key) is not None}


def _apply_stop_defaults(config: dict[str, Any]) -> None:
    """Write each benchmark's default stop sequences (which depend on its kind and prompt
    format) into its entry, so that every cell's settings name the stops it ran with and a
    changed default reruns the cells it changes."""
    from tokenflip.run.benchmarks import BENCHMARKS

    for spec in config["benchmarks"].values():
        if isinstance(spec, dict) and "stop" not in spec and spec.get("kind") in BENCHMARKS:
            spec["stop"] = list(BENCHMARKS[spec["kind"]].default_stop(spec.get("format", "chat")))


def _benchmark_problems(config: dict[str, Any]):
    """Build every benchmark and count its items. Hub sources are not fetched here (a
    login node may have no network); their records are checked when a cell loads them."""
    from tokenflip.run.benchmarks import BenchmarkError, build_benchmark

    for name, spec in config["benchmarks"].items():
        try:
            bench = build_benchmark(name, spec)
            if bench.reads_hub:
                continue
            bench.items()
            if hasattr(bench, "shot_tasks"):
                bench.shot_tasks()
        except BenchmarkError as exc:
            yield f"benchmarks.{name}: {exc}"


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
        return (f"{excerpt(error.instance)} contains characters that are not allowed in file names "
                f"(allowed: {error.validator_value})")
    if error.validator == "enum":
        return f"{excerpt(error.instance)} is not one of {error.validator_value}"
    if error.validator == "maxLength" and isinstance(error.instance, str):
        return (f"{excerpt(error.instance, 24)} is {len(error.instance)} characters long, more than the "
                f"{error.validator_value} that keep every file name of the run within the file system's limit")
    if error.validator == "minimum":
        return f"{error.instance!r} is below the minimum {error.validator_value}"
    if error.validator == "maximum":
        why = " (seeds go to torch.manual_seed as 64-bit integers)" if error.validator_value == SEED_MAXIMUM else ""
        return f"{error.instance!r} is above the maximum {error.validator_value}{why}"
    if error.validator == "type" and error.validator_value == "integer" and isinstance(error.instance, float):
        return f"{error.instance!r} is not an integer (write it without a decimal point or exponent)"
    if error.validator == "additionalProperties":
        return redacted(error.message.replace("Additional properties are not allowed", "unknown key(s)"))
    return redacted(error.message)


def _undefined_names(config: dict[str, Any]):
    """Labels and names a grid uses that are not defined (without them no cell can be listed)."""
    for i, grid in enumerate(config["grids"]):
        for axis, block in (("decoding", "decoding"), ("intervention", "interventions")):
            for label in grid.get(axis, [GRID_DEFAULTS[axis]]):
                if label not in config[block]:
                    yield (f"grids.{i}.{axis}: {label!r} is not defined under '{block}' "
                           f"(defined: {sorted(config[block])})")
        for key in ("models", "benchmarks"):
            for name in grid.get(key, []):
                if name not in config[key]:
                    yield f"grids.{i}.{key}: {name!r} is not defined under '{key}' (defined: {sorted(config[key])})"
        for name in grid.get("engine", []):
            if name not in engines.ENGINES and name not in config["endpoints"]:
                yield (f"grids.{i}.engine: {name!r} is neither an engine ({', '.join(engines.ENGINES)}) nor "
                       f"defined under 'endpoints' (defined: {sorted(config['endpoints'])})")
        for label in grid.get("load", []):
            if label != "none" and label not in config["loads"]:
                yield f"grids.{i}.load: {label!r} is not defined under 'loads' (defined: {sorted(config['loads'])})"
    for name in config["endpoints"]:
        if name in engines.ENGINES:
            yield f"endpoints.{name}: an endpoint cannot take the name of an engine ({', '.join(engines.ENGINES)})"
    if "none" in config["loads"]:
        yield "loads.none: 'none' is the load axis's word for no background load; name the load otherwise"


def _semantic_problems(config: dict[str, Any]):
    """Cross-references the schema cannot express."""
    from tokenflip.run.interventions import spec_problems
    from tokenflip.study.plan import expand_cells, pairs_of_comparison

    undefined = list(_undefined_names(config))
    yield from undefined
    too_large = list(checks.size_problems(config))
    if too_large:  # no cell is listed: listing them is what would not end
        yield from too_large
        return
    for name, spec in config["interventions"].items():
        yield from spec_problems(name, spec)
    values: dict[str, set] = {axis: set() for axis in AXES}
    for grid in config["grids"]:
        for axis in AXES:
            values[axis].update(axis_value(axis, v) for v in grid.get(axis, [GRID_DEFAULTS.get(axis)]))
    for i, comp in enumerate(config["comparisons"]):
        axis = comp["axis"]
        if axis_value(axis, comp["a"]) == axis_value(axis, comp["b"]):
            yield f"comparisons.{i}: a and b are both {comp['a']!r}; a comparison needs two values"
        for side in ("a", "b"):
            if axis_value(axis, comp[side]) not in values[axis]:
                yield (f"comparisons.{i}.{side}: {comp[side]!r} is not a value of axis '{axis}' "
                       f"in any grid (values: {sorted(map(str, values[axis]))})")
    for i, comp in enumerate(config["comparisons"]):
        for key in ("models", "benchmarks"):
            for name in comp.get(key, []):
                if name not in config[key]:
                    yield (f"comparisons.{i}.{key}: {name!r} is not defined under '{key}' "
                           f"(defined: {sorted(config[key])})")
    for probe, spec in config.get("probes", {}).items():
        for key in ("models", "benchmarks"):
            for name in spec.get(key, []):
                if name not in config[key]:
                    yield (f"probes.{probe}.{key}: {name!r} is not defined under '{key}' "
                           f"(defined: {sorted(config[key])})")
    if not undefined:
        yield from engines.config_problems(config, GRID_DEFAULTS)
        yield from _probe_form_problems(config)
        yield from checks.probe_engine_problems(config)
        yield from checks.tokenizer_only_problems(config)
        yield from limits.model_problems(config)
    if not undefined:
        cells = expand_cells(config)
        for i, comp in enumerate(config["comparisons"]):
            if axis_value(comp["axis"], comp["a"]) != axis_value(comp["axis"], comp["b"]) \
                    and not pairs_of_comparison(comp, cells):
                yield (f"comparisons.{i}: {comp['axis']} {comp['a']!r} vs {comp['b']!r} forms no pair: no two "
                       f"cells differ only in {comp['axis']!r} (put both values in one grid, with the same "
                       f"other axis values)")
        yield from checks.same_setting_problems(config, cells)
    yield from rounds.problems(config)
    yield from hub.id_problems(config)


def _probe_form_problems(config: dict[str, Any]):
    """A probe's cache forms (`forms: [kv_dtype=int8]`) run the same cache classes as a
    grid's, and are refused for the same reasons."""
    from tokenflip.run.caches import kv_dtype_unavailable

    for probe, spec in config.get("probes", {}).items():
        for form in spec.get("forms", []):
            axis, _, value = str(form).partition("=")
            reason = kv_dtype_unavailable(value) if axis == "kv_dtype" else None
            if reason:
                yield f"probes.{probe}.forms: {form!r}: {reason}"


def load(path: str | Path, check_data: bool = True) -> dict[str, Any]:
    """Read and validate a config file (the entry point outside Snakemake)."""
    return validate(read_yaml(path), source=str(path), check_data=check_data)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, mappings merged key by key (what Snakemake does with
    several --configfile and --config values)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out
