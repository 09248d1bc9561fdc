"""The command line outside Snakemake: run one cell, print its digest, exit codes; every
option of every command given hostile values."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import tiny_study, write_yaml
from tokenflip.core import storage


def tokenflip(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tokenflip", *args], capture_output=True, text=True, cwd=cwd)


def test_run_cell_then_digest(tmp_path):
    cfg = {"run": "cli", "models": {"tiny": {"source": "random", "architecture": "llama"}},
           "benchmarks": {"arith": {"kind": "arithmetic", "n": 2, "max_new_tokens": 5}},
           "generation": {"device": "cpu", "threads": 1},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}], "comparisons": []}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = tokenflip("run-cell", "--config", "c.yaml", "--cell", "tiny/arith/fp32-on-bs1-greedy-none", "--quiet",
                    cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    cell = tmp_path / "results/cli/cells/tiny/arith/fp32-on-bs1-greedy-none.parquet"
    meta = storage.read_metadata(cell)
    assert (tmp_path / "resources/models/tiny/model.json").exists()
    digest = tokenflip("digest", str(cell))
    assert digest.returncode == 0 and digest.stdout.split()[0] == meta["token_stream_sha256"]

    missing = tokenflip("run-cell", "--config", "c.yaml", "--cell", "tiny/arith/fp16-on-bs1-greedy-none",
                        cwd=tmp_path)
    assert missing.returncode == 1
    assert "c.yaml: no cell 'tiny/arith/fp16-on-bs1-greedy-none'" in missing.stderr
    assert tokenflip("digest", str(tmp_path / "nope.parquet")).returncode == 1
    assert tokenflip("frobnicate").returncode == 2


# --- every option of every subcommand, given hostile values ------------------------------------

# Runs in one interpreter: each case is `cli.main(argv)` with stderr captured and a deadline
# (a command that reads a pipe or a device waits forever); an exception that escapes is the
# traceback a user would see.
DRIVER = r"""
import contextlib, io, json, signal, sys, traceback
from tokenflip.cli import main as cli

def deadline(signum, frame):
    raise TimeoutError("no answer within the deadline")

signal.signal(signal.SIGALRM, deadline)
results = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    signal.alarm(30)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli.main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
                if not isinstance(exc.code, int) and exc.code is not None:
                    err.write(str(exc.code))
    except BaseException:
        code, err = "traceback", io.StringIO(traceback.format_exc())
    finally:
        signal.alarm(0)
    results.append([code, err.getvalue()[-3000:]])
print(json.dumps(results))
"""

LONG = "x" * 10_000
NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e309", "1e-320", LONG, ""]
LENGTHS = ["gsm8k", "=5", "arith_a=nan", "arith_a=inf", "arith_a=-1", "arith_a=0", "arith_a=1e309",
           f"{LONG}=5", "arith_a=" + LONG]
JSONS = ["", LONG, "{", "NaN", '{"a": NaN}', "1e309", '{"a": -Infinity}', "[" * 100_000 + "]" * 100_000,
         "5", "[1]", "null", '"' + LONG + '"', '{"source": "hf", "id": "' + LONG + '"}',
         '{"source": "hf", "id": "../../etc/passwd"}', '{"source": "hf", "id": "https://example.invalid/x"}']
STRINGS = ["", LONG, "../../etc/passwd", "--help-me", "\u202eevil"]


def _commands():
    """{name: subparser} from the parser itself, so that a new command is covered."""
    from tokenflip.cli import main as cli

    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def _kind(action) -> str:
    from tokenflip.cli import args as cli_args

    if action.nargs == 0:
        return "flag"
    if getattr(action.type, "kind", None):
        return "path:" + action.type.kind
    if action.type is cli_args.json_arg:
        return "json"
    if action.type in (cli_args.model_ref, cli_args.tokenizer_ref):  # a JSON model entry, a hub id or directory
        return "model"
    if action.type is cli_args.length_arg:
        return "length"
    if action.choices:
        return "choice"
    if getattr(action.type, "__name__", "") in ("number", "integer"):
        return "number"
    if action.type is cli_args.url:
        return "url"
    if action.type in (cli_args.label, cli_args.dirname, cli_args.served_name, cli_args.duration,
                       cli_args.cores, cli_args.snakemake_options):  # checked text
        return "string"
    assert action.type is None, f"{action.dest}: a type this test does not know: {action.type}"
    return "string"


def _files(tmp_path: Path) -> dict[str, Path]:
    """Hostile things a path can name: besides /dev/zero, a directory, a pipe, an empty
    file, a bare number, nesting deeper than the parsers recurse, 2 MiB of text, bytes
    that are not UTF-8."""
    files = {"dir": tmp_path / "a-directory", "fifo": tmp_path / "a-pipe", "empty": tmp_path / "empty.json",
             "number": tmp_path / "number.json", "deep": tmp_path / "deep.json", "big": tmp_path / "big.yaml",
             "binary": tmp_path / "binary.parquet", "absent": tmp_path / "absent" / "file",
             "absent-out": tmp_path / "absent-out" / "file"}
    files["dir"].mkdir()
    os.mkfifo(files["fifo"])
    files["empty"].write_text("")
    files["number"].write_text("5\n")
    files["deep"].write_text("[" * 100_000 + "]" * 100_000)
    files["big"].write_text("a: 1\n" + "# padding\n" * 220_000)
    files["binary"].write_bytes(bytes(range(256)) * 64)
    files["calibration"] = tmp_path / "calibration.json"
    files["calibration"].write_text(json.dumps({"overhead_per_layer_ms": {"1": 1.0}}))
    return files


def _values(kind: str, files: dict[str, Path]) -> list[str]:
    if kind == "number":
        return NUMBERS
    if kind == "length":
        return LENGTHS
    if kind == "json":
        return JSONS
    if kind == "model":
        return JSONS + STRINGS
    if kind in ("choice", "string", "url"):
        return STRINGS
    if kind == "flag":  # a flag takes no value: `--cost=nan` is a usage error
        return ["nan", LONG]
    paths = [str(files[k]) for k in ("dir", "fifo", "absent")] + [LONG, ""]
    if kind in ("path:out", "path:outdir"):
        return [str(files[k]) for k in ("dir", "fifo", "absent-out")] + [LONG, ""]
    # read, never written: a device and hostile contents too
    return paths + ["/dev/zero"] + [str(files[k]) for k in ("empty", "number", "deep", "big", "binary")]


def _base(tmp_path: Path, files) -> dict[str, str]:
    """A placeholder per kind for the options a command requires: well-formed, so that the
    hostile value of another option is what the command meets first."""
    config = write_yaml(tmp_path / "study.yaml", tiny_study())
    cell = tmp_path / "cell.parquet"
    cell.write_text("not a parquet file")
    return {"path:config": str(config), "path:file": str(cell), "path:dir": str(files["dir"]),
            "path:out": str(tmp_path / "out" / "result.parquet"), "path:outdir": str(tmp_path / "outdir" / "m"),
            "path:calibration": str(files["calibration"]),
            "json": "{}", "model": "x", "string": "x", "number": "1", "length": "arith_a=5", "choice": None,
            # a URL where nothing answers (port 9, discard): refused at once, naming it
            "url": "http://127.0.0.1:9/v1"}


def _cases(tmp_path: Path):
    """(command, option, kind, value, argv) for every option of every command and every
    hostile value of its kind; the other required options get `_base` placeholders."""
    files = _files(tmp_path)
    base = _base(tmp_path, files)
    for name, parser in _commands().items():
        actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        groups = [g for g in parser._mutually_exclusive_groups if g.required]
        chosen = {g._group_actions[0] for g in groups}
        for action in actions:
            kind = _kind(action)
            siblings = {a for g in groups if action in g._group_actions for a in g._group_actions}
            for value in _values(kind, files):
                argv = [name]
                for other in actions:
                    given = value if other is action else base[_kind(other)] if (
                        other.required or not other.option_strings or other in chosen) else None
                    if other is not action and (other in siblings or given is None):
                        continue
                    if other is action and other.nargs == 0:
                        argv.append(f"{other.option_strings[-1]}={given}")
                    elif other.option_strings:
                        argv += [other.option_strings[-1]] + ([] if other.nargs == 0 else [given])
                    else:
                        argv.append(given)
                yield name, (action.option_strings or [action.dest])[-1], kind, value, argv


def test_every_option_of_every_command_refuses_hostile_values_without_a_traceback(tmp_path):
    """Each option of each subcommand (enumerated from the parser) is given every hostile
    value of its kind: numbers out of range or not finite (exit 2, naming the option), JSON
    that is not JSON, not finite or nested 100,000 deep (exit 2), paths to a device, a
    directory, a pipe, an empty, bare-number, deeply nested, 2 MiB or binary file, a 10,000
    character name (exit 1, naming the option and the file). Never a traceback, never a hang."""
    cases = list(_cases(tmp_path))
    commands = {c[0] for c in cases}
    assert commands == set(_commands()) and len(commands) >= 11
    work = tmp_path / "cwd"  # whatever a command writes by default lands here
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([c[4] for c in cases]),
                          capture_output=True, text=True, cwd=work, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    valid = {"path:dir": {str(tmp_path / "a-directory")},
             "path:outdir": {str(tmp_path / "a-directory"), str(tmp_path / "absent-out" / "file")},
             "path:out": {str(tmp_path / "absent-out" / "file")}}
    # A Parquet file's contents are checked when it is read (storage names the file), which a
    # command whose other inputs are placeholders may not reach: refused, but maybe for those.
    contents = {str(tmp_path / name) for name in ("empty.json", "number.json", "deep.json", "big.yaml",
                                                  "binary.parquet")}
    failures = []
    for (name, option, kind, value, argv), (code, stderr) in zip(cases, results):
        if kind in ("number", "length", "choice", "flag") or (kind == "json" and value in JSONS[:8]) or \
                (kind == "model" and (value.lstrip().startswith("{") and value in JSONS[:8] or value in ("", LONG))):
            expected = {2}  # usage: the option's value is not one it takes
        elif kind.startswith("path:") and value not in valid.get(kind, ()):
            expected = {1}  # refused input: the path names nothing the command can use
        else:
            expected = {0, 1, 2}
        if name == "gate" and code == 4 and "no summary of pairs" in stderr:
            expected = expected | {4}  # a value it took, then no run to read there: the gate's own code
        if name == "audit":  # a CI step's codes: a refused input is a usage error, a server not there 4
            expected = {2 if e == 1 else e for e in expected} | ({4} if "nothing answers at" in stderr else set())
        problem = None
        if code == "traceback" or "Traceback" in stderr:
            problem = "traceback"
        elif code not in expected:
            problem = f"exit {code}, expected {sorted(expected)}"
        elif len(expected) == 1 and option not in stderr and value[:40] not in stderr and \
                not (kind == "path:file" and value in contents):
            problem = "the message names neither the option nor the value"
        elif name == "prepare-model" and '"source": "hf"' in value and "--spec.id: " not in stderr:
            problem = "the hub id is not refused as one"
        if problem:
            failures.append(f"{name} {option} {value[:30]!r}…{value[-30:]!r}: {problem}\n    {stderr.strip()[-600:]}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:40])


def test_snakemake_options_that_start_with_a_dash_are_the_value_of_snakemake():
    """`tokenflip run C --snakemake "-p --keep-going"`: argparse alone takes "-p …" for an option."""
    from tokenflip.cli.args import attached_values
    from tokenflip.cli.main import build_parser

    argv = ["run", "study.yaml", "--snakemake", "-p --keep-going", "--dry-run"]
    assert attached_values(argv) == ["run", "study.yaml", "--snakemake=-p --keep-going", "--dry-run"]
    args = build_parser().parse_args(attached_values(argv))
    assert args.snakemake == ["-p", "--keep-going"] and args.dry_run
    assert attached_values(["run", "c.yaml", "--snakemake"]) == ["run", "c.yaml", "--snakemake"]


def test_every_refusal_a_command_ends_with_in_one_line_names_a_class_that_exists():
    """`run_command` catches refusals by the classes of modules already imported (a light
    command imports no heavy module to catch its errors): each name must stay a real class."""
    import importlib

    from tokenflip.cli.main import AUDIT_USAGE, REFUSALS

    for module, name in REFUSALS:
        assert issubclass(getattr(importlib.import_module(module), name), Exception), (module, name)
    assert AUDIT_USAGE <= {name for _, name in REFUSALS}
