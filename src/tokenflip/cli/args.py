"""The command line's argument types and path checks: every option's value refused, with the
option named, before a command does any work (numbers finite and in range, JSON bounded,
paths checked for what the command does with them)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from tokenflip.core.inputs import (
    InputError,
    check_input_dir,
    check_input_file,
    check_output,
    check_yaml_file,
    loads_json,
    shown,
)

# Inline JSON beyond this is no job spec or config (the plan's largest is a few kB).
MAX_JSON_CHARS = 2**20


def json_arg(text: str):
    """A JSON option's value: valid JSON, finite numbers, bounded size and nesting."""
    if len(text) > MAX_JSON_CHARS:
        raise argparse.ArgumentTypeError(f"{len(text):,} characters of JSON, more than {MAX_JSON_CHARS:,}")
    try:
        return loads_json(text, shown(text, 40))
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_ref(text: str):
    """A model named on the command line: a config models entry as JSON (text starting with
    '{'), else a hub id or a local directory, checked as the config's id check checks it."""
    from tokenflip.models.hub import id_problem

    if text.lstrip().startswith("{"):
        return json_arg(text)
    if not text.strip() or len(text) > 4096:
        raise argparse.ArgumentTypeError(f"expected a hub id, a local directory or a JSON model entry, got "
                                         f"{shown(text, 40)}")
    why = id_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def tokenizer_ref(text: str):
    """`audit --tokenizer`: `server` (the served model's own, asked of the server), else a
    model as `model_ref` reads it (a directory named `server` is `./server`)."""
    return "server" if text == "server" else model_ref(text)


def number(low: float, high: float, unit: str = "", integer: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (an integer with `integer`); NaN,
    infinities and 1e309 are refused, not priced or counted."""
    def convert(text: str):
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text, 40)} is not {'an integer' if integer else 'a number'}") \
                from None
        if not math.isfinite(value) or not low <= value <= high:
            bounds = f"{low:,} to {high:,}" if integer else f"{low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"expected a finite {'integer' if integer else 'number'} from {bounds}"
                                             f"{' ' + unit if unit else ''}, got {shown(text, 40)}")
        return value

    convert.__name__ = "integer" if integer else "number"
    return convert


# What a command does with a path it is given, and the check it passes before the command runs.
PATH_CHECKS: dict[str, Callable[[str, str], object]] = {
    "file": check_input_file,                                          # a file it reads
    "config": check_yaml_file,                                         # a config it reads
    "dir": check_input_dir,                                            # a directory it reads
    "out": check_output,                                               # a file it writes
    "outdir": lambda path, where: check_output(path, where, directory=True),  # a directory it creates or reads
    "calibration": lambda path, where: calibration(path),              # a GPU's step overhead, read whole
}


def calibration(path: str) -> None:
    from tokenflip.study.cost.model import gpu_overhead_from

    gpu_overhead_from(path)


def path_type(kind: str) -> Callable[[str], str]:
    """The argparse type of a path option: the text itself, marked with what the command
    does with it (`kind`, a key of PATH_CHECKS), checked by `check_paths` before it runs."""
    def path(text: str) -> str:
        return text

    path.kind = kind  # type: ignore[attr-defined]
    return path


PATH_TYPES = {kind: path_type(kind) for kind in PATH_CHECKS}


def path_arg(p: argparse.ArgumentParser, *flags: str, kind: str, group=None, **kwargs) -> argparse.Action:
    """Add an option or positional naming a path (to `group` of `p` where given); `check_paths`
    checks it before the command runs."""
    action = (group or p).add_argument(*flags, type=PATH_TYPES[kind], **kwargs)
    where = action.option_strings[-1] if action.option_strings else action.dest
    p.set_defaults(path_checks=[*(p.get_default("path_checks") or []), (action.dest, where, kind)])
    return action


def check_paths(args: argparse.Namespace) -> None:
    """Every path the command was given, checked for what the command does with it
    (`InputError` naming the option, the path and what is wrong)."""
    for dest, where, kind in getattr(args, "path_checks", None) or []:
        value = getattr(args, dest, None)
        for path in value if isinstance(value, list) else [value]:
            if path is not None:
                PATH_CHECKS[kind](path, where)


def model_spec(spec, option: str = "--spec") -> dict:
    """A config's models entry given as `option` (`prepare-model --spec`, `audit --tokenizer`),
    checked as the config's schema and its id check would check it."""
    from tokenflip.models.hub import id_problem
    from tokenflip.study import config as cfg

    if not isinstance(spec, dict):
        raise InputError(f"{option}: expected a JSON object (a config's models entry), got {type(spec).__name__}")
    entry = cfg.schema()["properties"]["models"]["additionalProperties"]
    errors = sorted(cfg.Validator(entry).iter_errors(spec), key=lambda e: list(map(str, e.absolute_path)))
    problems = [f"{option}.{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message[:300]}"
                for e in errors]
    if not problems and spec["source"] == "hf" and (why := id_problem(spec["id"])):
        problems.append(f"{option}.id: {why}")
    if problems:
        raise InputError("; ".join(problems))
    return spec


def length_arg(text: str) -> tuple[str, float]:
    """BENCHMARK=N: the prompt length to assume for a benchmark (a finite number of tokens)."""
    import re

    from tokenflip.study.config import schema
    from tokenflip.study.cost.model import MAX_PROMPT_TOKENS

    name, sep, n = text.partition("=")
    try:
        tokens = float(n)
    except ValueError:
        tokens = math.nan
    names = schema()["$defs"]["dirname"]  # what a benchmark's name can be
    if len(name) > names["maxLength"] or not re.fullmatch(names["pattern"], name):
        raise argparse.ArgumentTypeError(f"{shown(text, 40)}: {shown(name, 40)} cannot be a benchmark's name")
    if not sep or not math.isfinite(tokens) or not 1 <= tokens <= MAX_PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"{shown(text, 40)}: expected BENCHMARK=TOKENS, TOKENS a number from 1 to "
                                         f"{MAX_PROMPT_TOKENS:g}, e.g. gsm8k=900")
    return name, tokens


def url(text: str) -> str:
    """An endpoint's base URL: http(s), no spaces, bounded, no credentials (a key comes from
    --api-key-env; a URL is printed and recorded), no query or fragment."""
    from urllib.parse import urlsplit

    from tokenflip.core.excerpt import excerpt

    if len(text) > 2048 or not text.startswith(("http://", "https://")) or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {excerpt(text, 80)}")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a URL: {excerpt(text, 80)}") from None
    if "@" in parts.netloc:
        raise argparse.ArgumentTypeError(f"the URL holds a user name or password (…@{parts.hostname}): name the "
                                         f"variable that holds the key with --api-key-env instead")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"a base URL takes no query or fragment, got {excerpt(text, 80)}")
    return text.rstrip("/")


def label(text: str) -> str:
    """A name used in file names, as the config's labels are."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,39}", text):
        raise argparse.ArgumentTypeError(f"expected a name of letters, digits, '_' and '.', got {shown(text, 80)}")
    return text


def served_name(text: str) -> str:
    """A model name a server serves under, as deployments name theirs ("acme/support-bot-8b",
    "meta-llama/Llama-3.1-8B-Instruct:q4"): letters, digits and '_.-/:', at most 128; it goes
    on a server's command line, never into a file name."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-/:]{0,127}", text) or "//" in text or text.endswith("/"):
        raise argparse.ArgumentTypeError(f"expected a served model name of letters, digits and '_.-/:' (such as "
                                         f"acme/support-bot-8b), got {shown(text, 80)}")
    return text


# Options whose value is itself options ("-p --keep-going"): argparse would take the value for
# an option of its own; `attached_values` writes them as --option=VALUE first.
OPTION_VALUED = ("--snakemake",)


def attached_values(argv: list[str]) -> list[str]:
    """`argv` with each value of an `OPTION_VALUED` option attached to it."""
    out, words = [], iter(argv)
    for word in words:
        if word in OPTION_VALUED:
            value = next(words, None)
            out.append(word if value is None else f"{word}={value}")
        else:
            out.append(word)
    return out


def snakemake_options(text: str) -> list[str]:
    """More Snakemake options given as one string, split as a shell splits it; each an option
    (a value follows its option), so that no word is taken for a config or a target by accident."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not options a shell can split ({exc}): {shown(text, 80)}") from None
    if words and not words[0].startswith("-"):
        raise argparse.ArgumentTypeError(f"expected Snakemake options such as '--keep-going', got {shown(text, 80)}")
    return words


def cores(text: str) -> str:
    """Snakemake's --cores: a number of cores, or `all`."""
    if text == "all":
        return text
    return str(number(1, 4096, "cores", integer=True)(text))


def duration(text: str) -> str:
    """A time budget as `rounds.budget` takes it: "10 min", "90 s", "2 h"."""
    import re

    from tokenflip.study.rounds import BUDGET_PATTERN

    if not re.fullmatch(BUDGET_PATTERN, text):
        raise argparse.ArgumentTypeError(f"expected a time such as '10 min', '90 s' or '2 h', got {shown(text, 40)}")
    return text


def dirname(text: str) -> str:
    """A run or model name, used as a directory name, as the config's are."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", text):
        raise argparse.ArgumentTypeError(f"expected a name of letters, digits, '_', '.' and '-', got {shown(text, 80)}")
    return text


def config_args(p: argparse.ArgumentParser) -> None:
    """--config FILE or --config-json TEXT, one of them."""
    group = p.add_mutually_exclusive_group(required=True)
    path_arg(p, "--config", kind="config", group=group, help="config YAML file")
    group.add_argument("--config-json", type=json_arg, help="the config itself, as JSON")


def run_args(p: argparse.ArgumentParser) -> None:
    """A config and the working directory of its run."""
    config_args(p)
    path_arg(p, "--root", kind="outdir", help="the working directory that holds results/ and reports/ (default: .)")
