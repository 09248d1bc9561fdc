"""`tokenflip` command line: what the Snakemake rules call, and what people call by hand.

Exit codes: 0 success, 1 refused input (a file, a config, a job spec; message on stderr),
2 usage (an option's value out of its range, not a number, not JSON), 3 `diff-runs` found
cells that differ.

Every input is checked before the command does any work: numbers by their option's type
(finite, in range), paths by what the command does with them (`PATH_CHECKS`: a file to
read is a regular file, a file to write is not a device or a directory), files by
`tokenflip.core.inputs` (size, nesting, finite numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenflip.analysis.power import power_lines
from tokenflip.cli.args import attached_values, check_paths, config_args, json_arg, length_arg, model_spec, number, path_arg, run_args
from tokenflip.cli.audit import add_commands as add_endpoint_commands
from tokenflip.cli.gate import add_command as add_gate_command
from tokenflip.cli.generate import cmd_generate, hand_over_job
from tokenflip.cli.run_cell import cmd_run_cell
from tokenflip.cli.workflow import add_command as add_run_command
from tokenflip.core.excerpt import redacted
from tokenflip.core.inputs import InputError, shown


def cmd_prepare_model(args) -> None:
    from tokenflip.models.hub import is_local_dir
    from tokenflip.models.prepare import ModelError, prepare

    spec = model_spec(args.spec)
    try:
        manifest = prepare(spec, args.out)
    except (OSError, ValueError) as exc:  # the hub's errors are OSErrors: say why, and what fixes it
        if spec.get("source") != "hf":
            raise
        cause = None
        if not is_local_dir(spec["id"]):
            from tokenflip.models.hub import check_model

            cause = check_model(Path(args.out).name, args.spec)
        raise ModelError(cause or f"{args.spec['id']}: {type(exc).__name__}: {exc}") from exc
    print(json.dumps({k: manifest[k] for k in ("architecture", "num_parameters", "weights_sha256")}))


def cmd_check_prompts(args) -> None:
    """Encode every prompt of a benchmark with a prepared model's tokenizer (no weights)."""
    from tokenflip.core.storage import write_json
    from tokenflip.models.prepare import load_tokenizer
    from tokenflip.run.benchmarks import build_benchmark
    from tokenflip.run.runtime import check_prompts
    from tokenflip.study.limits import context_length

    bench = build_benchmark(args.benchmark, args.spec)  # the spec is checked before the tokenizer loads
    result = check_prompts(load_tokenizer(args.model_dir), bench, args.max_new_tokens, context_length(args.model_dir))
    write_json(args.out, {**result, "model_dir": str(args.model_dir)})
    print(f"{args.benchmark}: {result['prompts']} prompts, {result['min_tokens']}-{result['max_tokens']} tokens, "
          f"{result['prompt_style']}")


def cmd_probe(args) -> None:
    from tokenflip.core.specs import JobSpecError, ProbeJob
    from tokenflip.run.probes import PROBES

    job = ProbeJob.from_json(args.job)
    if job.probe not in PROBES:
        raise JobSpecError(f"probe job: unknown probe {job.probe!r}; known: {PROBES.names()}")
    # A probe that explains pairs (`Probe.explains`) also gets their result files.
    PROBES[job.probe].run(job, args.model_dir, args.out_dir, *([args.pairs] if args.pairs else []))
    print(f"probe {job.probe} written to {args.out_dir}")


def cmd_compare(args) -> None:
    from tokenflip.analysis.compare import ComparabilityError, compare_files
    from tokenflip.core.axes import AXES
    from tokenflip.core.specs import Cell, Pair
    from tokenflip.core.storage import read_metadata

    if args.pair_id:
        pair = Pair.from_id(args.pair_id)
    else:
        metas = [read_metadata(path) for path in (args.a, args.b)]
        for path, meta in zip((args.a, args.b), metas):
            if meta.get("kind") != "cell":
                raise ComparabilityError(f"{path}: a {meta.get('kind')!r} file; compare takes two cell files")
        a, b = (Cell.from_dict(meta["cell"]) for meta in metas)
        axes = [ax for ax in AXES if a.value(ax) != b.value(ax)]
        if len(axes) != 1 or a.model != b.model or a.benchmark != b.benchmark:
            raise ComparabilityError(f"{args.a} and {args.b} differ in {axes or 'nothing'}"
                                     f"{' and in model or benchmark' if (a.model, a.benchmark) != (b.model, b.benchmark) else ''}"
                                     f": compare needs two cells of one model and benchmark that differ in exactly one axis")
        pair = Pair(axes[0], a, b)
    meta = compare_files(pair, args.a, args.b, args.out)
    s = meta["summary"]
    # The interval and the verdict are the run's summary's (`tokenflip summarize`), made in one process.
    print(f"{pair.label}: {s['n_diverged']}/{s['n_prompts']} prompts diverged ({100 * s['divergence_rate']:.1f}%)")


def _config(args, check_data: bool = True):
    from tokenflip.study import config as cfg

    if getattr(args, "config_json", None) is not None:
        return cfg.validate(args.config_json, source="--config-json", check_data=check_data)
    return cfg.load(args.config, check_data=check_data)


def _layout(args, config):
    from tokenflip.core.layout import RunLayout

    return RunLayout(config["run"], root=args.root or "")


def cmd_summarize(args) -> None:
    from tokenflip.analysis.summary import write_summaries

    config = _config(args, check_data=False)
    write_summaries(config, _layout(args, config))


def cmd_report(args) -> None:
    """The report from the summaries; with --partial (after a failed run), from whatever
    results exist, listing the missing and refused ones."""
    from tokenflip.report import render, render_partial

    config = _config(args, check_data=False)
    layout = _layout(args, config)
    if args.partial:
        out = render_partial(config, layout)
        print(f"partial report (some jobs failed or are missing): {out}")
    else:
        print(render(layout.summary_dir, layout.report, config))
        import shutil

        Path(layout.partial_report).unlink(missing_ok=True)   # superseded by the complete report
        shutil.rmtree(layout.partial_report_tables, ignore_errors=True)


def cmd_digest(args) -> None:
    from tokenflip.core.storage import read_cell

    for path in args.cells:
        _, meta = read_cell(path)
        print(f"{meta['token_stream_sha256']}  {path}")


def cmd_diff_runs(args) -> None:
    """Exit status 0 when every shared cell is bitwise identical, 3 when some differ."""
    from tokenflip.analysis.compare import compare_tables
    from tokenflip.core.layout import cell_ids_under, cells_dir_of
    from tokenflip.core.provenance import kernel_differences
    from tokenflip.core.storage import StorageError, read_cell

    roots = [cells_dir_of(args.run_a), cells_dir_of(args.run_b)]
    for root in roots:
        if not root.is_dir():
            raise StorageError(f"{root}: no such directory (give two results/<run> directories)")
    files = [cell_ids_under(root) for root in roots]
    shared = sorted(set(files[0]) & set(files[1]))
    if not shared:
        raise StorageError(f"no cell is in both {roots[0]} and {roots[1]}")
    differing = 0
    kernels: dict[str, list[str]] = {}
    for cell_id in shared:
        (table_a, meta_a), (table_b, meta_b) = (read_cell(f[cell_id]) for f in files)
        machines = " vs ".join(m["environment"]["device"]["name"] for m in (meta_a, meta_b))
        for line in kernel_differences(meta_a["environment"]["device"], meta_b["environment"]["device"]):
            kernels.setdefault(line, []).append(cell_id)
        if meta_a["token_stream_sha256"] == meta_b["token_stream_sha256"]:
            same_logits = meta_a["logits_sha256"] == meta_b["logits_sha256"]
            print(f"identical  {cell_id}  (tokens{' and logits' if same_logits else ', logits differ'}; {machines})")
            continue
        differing += 1
        per_prompt = compare_tables(table_a, table_b, int(meta_a["settings"]["record_top_k"])).to_pandas()
        diverged = per_prompt[~per_prompt["identical"]]
        if diverged.empty:
            print(f"DIFFERENT  {cell_id}  (other prompts or prompt ids; {machines})")
            continue
        first = diverged.sort_values("first_div_step").iloc[0]
        print(f"DIFFERENT  {cell_id}  {len(diverged)}/{len(per_prompt)} prompts; earliest at step "
              f"{int(first['first_div_step'])} of {first['prompt_id']} ({machines})")
    only = sorted(set(files[0]) ^ set(files[1]))
    for cell_id in only:
        print(f"only in {'a' if cell_id in files[0] else 'b'}  {cell_id}")
    for line, cells in kernels.items():
        print(f"kernels may differ: {line} ({len(cells)} shared cell{'s' if len(cells) != 1 else ''})")
    print(f"{len(shared) - differing} identical, {differing} different, {len(only)} in one run only")
    if differing:
        raise SystemExit(3)


def cmd_plan(args) -> None:
    from tokenflip.study.plan import expand_cells, expand_pairs, probe_targets
    from tokenflip.study.rounds import plan_lines

    config = _config(args)
    if args.prompt_tokens:  # named benchmarks are checked with or without --cost
        from tokenflip.study.cost.estimate import check_prompt_tokens

        check_prompt_tokens(config, dict(pair for group in args.prompt_tokens for pair in group))
    if args.cost:
        from tokenflip.study.cost.estimate import format_cost, price

        cost = price(config, args.device, args.bandwidth_gbs, args.tflops, args.calibration, args.root,
                     dict(pair for group in args.prompt_tokens or [] for pair in group))
        if args.json:
            print(json.dumps(cost, indent=2, sort_keys=True, default=str))
            return
        from tokenflip.analysis.power import budget_lines

        print(format_cost(cost))
        hours = "CPU" if cost["device"]["kind"] == "cpu" else "GPU"
        for line in budget_lines(config, expand_pairs(config, expand_cells(config)), cost["per_cell"], hours):
            print(line)
        return
    cells = expand_cells(config)
    pairs = expand_pairs(config, cells)
    for cell in cells:
        print(f"cell  {cell.id}")
    for pair in pairs:
        print(f"pair  {pair.id}")
    probes = probe_targets(config)
    for probe, model, bench in probes:
        print(f"probe {model}/{bench}/{probe}")
    print("\n".join(power_lines(config, pairs)))  # what each comparison's prompts can show
    print("\n".join(plan_lines(config, cells)))
    print(f"{len(cells)} cells, {len(pairs)} pairs, {len(probes)} probe jobs", file=sys.stderr)


def _job_commands(sub) -> None:
    """The commands the pipeline's jobs call, one job spec each."""
    p = sub.add_parser("prepare-model", help="convert a model once into a prepared directory")
    p.add_argument("--spec", type=json_arg, required=True, help="model spec as JSON (a config 'models' entry)")
    path_arg(p, "--out", kind="outdir", required=True, help="directory to create")
    p.set_defaults(func=cmd_prepare_model)

    p = sub.add_parser("check-prompts", help="check that a prepared model's tokenizer takes a benchmark's "
                                             "prompt format (before any generation job)")
    p.add_argument("--benchmark", required=True, help="the benchmark's name in the config")
    p.add_argument("--spec", type=json_arg, required=True, help="the config's benchmark entry as JSON")
    path_arg(p, "--model-dir", kind="dir", required=True, help="prepared model directory")
    path_arg(p, "--out", kind="out", required=True, help="JSON record to write")
    p.add_argument("--max-new-tokens", type=number(1, 2**31 - 1, "tokens", integer=True), default=None,
                   help="the most tokens any cell or probe generates after a prompt (checked against the context)")
    p.set_defaults(func=cmd_check_prompts)

    p = sub.add_parser("generate", help="run one cell from its job spec (what the pipeline calls)")
    p.add_argument("--job", type=json_arg, required=True, help="cell job spec as JSON")
    path_arg(p, "--model-dir", kind="dir", required=True, help="prepared model directory")
    path_arg(p, "--out", kind="out", required=True, help="cell Parquet file to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("probe", help="run a mechanism probe for one model and benchmark")
    p.add_argument("--job", type=json_arg, required=True, help="probe job spec as JSON")
    path_arg(p, "--model-dir", kind="dir", required=True, help="prepared model directory")
    path_arg(p, "--out-dir", kind="outdir", required=True, help="directory for the probe's Parquet tables")
    path_arg(p, "--pairs", kind="file", nargs="*", default=[],
              help="pair results of the pairs the job explains, to choose its prompts from")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("compare", help="compare two cell files that differ in one axis")
    path_arg(p, "a", kind="file", help="cell file of side a")
    path_arg(p, "b", kind="file", help="cell file of side b")
    path_arg(p, "--out", kind="out", required=True, help="pair Parquet file to write")
    p.add_argument("--pair-id", help="pair id (model/benchmark/axis/a_vs_b/context), as the pipeline names it")
    p.set_defaults(func=cmd_compare)


def _run_commands(sub) -> None:
    """The commands people call on a config or a run."""
    from tokenflip.study.cost.model import GPU_BANDWIDTH_GBS, GPU_TFLOPS

    p = sub.add_parser("plan", help="list the cells, pairs and probe jobs a config defines (--cost: what they cost)")
    config_args(p)
    p.add_argument("--cost", action="store_true",
                   help="per rule, per cell and in total: jobs, prompts, generated tokens, token positions, weight "
                        "bytes read and device hours (docs/internals.md says which figures are bounds)")
    path_arg(p, "--root", kind="outdir",
              help="the working directory whose prompt checks and prepared models to read (default: .)")
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                   help="gpu: roofline and per-step overhead (default); cpu: time the study's own models on this "
                        "machine first (a short calibration) and price every job in CPU-hours")
    p.add_argument("--bandwidth-gbs", type=number(*GPU_BANDWIDTH_GBS, "GB/s"), default=2000.0,
                   help="GPU memory bandwidth, GB/s (default 2000)")
    p.add_argument("--tflops", type=number(*GPU_TFLOPS, "TFLOP/s"), default=150.0,
                   help="16-bit matrix throughput reached, TFLOP/s (default 150; fp32 at an eighth)")
    path_arg(p, "--calibration", kind="calibration", metavar="FILE",
              help="the GPU's per-step overhead: a GPU check's gpu-check.json (perf/gpu.sh), or JSON "
                   "{\"overhead_per_layer_ms\": {\"1\": 1.0, \"8\": 1.1}}")
    p.add_argument("--prompt-tokens", type=length_arg, nargs="+", action="append", metavar="BENCHMARK=N",
                   help="the prompt length to assume for a benchmark whose data is on the hub "
                        "(`--prompt-tokens gsm8k=910 mbpp=601`, or the option repeated)")
    p.add_argument("--json", action="store_true", help="with --cost: the figures as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("run-cell", help="run one cell of a config (no Snakemake), preparing its model if needed")
    path_arg(p, "--config", kind="config", required=True, help="config YAML file")
    p.add_argument("--cell", required=True, help="cell id, e.g. smollm2-135m/arithmetic/bf16-on-bs1-greedy-none")
    path_arg(p, "--out", kind="out", help="Parquet file to write (default: the pipeline's path under results/)")
    path_arg(p, "--models-dir", kind="outdir", help="prepared models (default: resources/models)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run_cell)

    p = sub.add_parser("summarize", help="check a run's results against its config and write the summary tables")
    run_args(p)
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("report", help="render the HTML report from the summary tables")
    run_args(p)
    p.add_argument("--partial", action="store_true",
                   help="after a failed run: summarise whatever results exist and render them, "
                        "listing what is missing or refused")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("digest", help="print the token-stream sha256 of cell files (recomputed from the data)")
    path_arg(p, "cells", kind="file", nargs="+", help="cell Parquet files")
    p.set_defaults(func=cmd_digest)

    p = sub.add_parser("diff-runs", help="which cells of two run directories are bitwise identical, "
                                         "and where the others first differ (exit 3 if any differ)")
    path_arg(p, "run_a", kind="dir", help="results/<run> directory (e.g. from a workstation)")
    path_arg(p, "run_b", kind="dir", help="results/<run> directory (e.g. from a cluster)")
    p.set_defaults(func=cmd_diff_runs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenflip", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _run_commands(sub)
    _job_commands(sub)
    add_endpoint_commands(sub)
    add_gate_command(sub)
    add_run_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(attached_values(sys.argv[1:] if argv is None else list(argv)))
    if args.command in ("generate", "probe", "prepare-model", "compare"):
        # Before the heavy imports (seconds on a loaded machine): a job whose scheduler
        # dies while it starts stops then, not once torch has loaded.
        from tokenflip.core.scheduler import watch_scheduler

        watch_scheduler()
    if args.command in ("generate", "probe"):  # a warm process holding the job's load may run it
        if (status := hand_over_job(args)) is not None:
            return status
    return run_command(args)


# The refusals a command ends with in one line (module, class), checked among the modules already
# imported (none other raised anything): a comparison imports no heavy module to catch errors.
REFUSALS = (("tokenflip.study.config", "ConfigError"), ("tokenflip.core.storage", "StorageError"),
            ("tokenflip.analysis.compare", "ComparabilityError"), ("tokenflip.models", "ModelError"),
            ("tokenflip.run.benchmarks.errors", "BenchmarkError"), ("tokenflip.core.specs", "JobSpecError"),
            ("tokenflip.analysis", "ResultError"), ("tokenflip.run.runtime", "PromptFormatError"),
            ("tokenflip.core.inputs", "InputError"), ("tokenflip.study.cost.model", "CostInputError"),
            ("tokenflip.run.engines.endpoint.client", "EndpointError"),
            ("tokenflip.run.engines.worker", "WorkerError"), ("tokenflip.run.engines.vllm_offline.support", "VllmError"),
            ("tokenflip.models.served_tokenizer", "ServedTokenizerError"))
# An audit's own refusals are usage errors (2); any other a deployment it cannot measure (4).
AUDIT_USAGE = {"ConfigError", "InputError", "BenchmarkError"}


def _refusal(exc: BaseException, names=None) -> bool:
    """Whether `exc` is one of REFUSALS (of `names` among them, where given)."""
    return any(isinstance(exc, getattr(sys.modules[module], name)) for module, name in REFUSALS
               if module in sys.modules and (names is None or name in names))


def run_command(args) -> int:
    """The command `args` names, its refusals as one line and an exit status."""
    try:
        check_paths(args)
        args.func(args)
    except Exception as exc:  # noqa: BLE001 - sorted below: a refusal, a file's error, or a defect
        if _refusal(exc):
            print(f"tokenflip {args.command}: error: {redacted(str(exc))}", file=sys.stderr)
            # An audit is a CI step: its own refusals are usage errors (2), a deployment it cannot
            # measure 4 (docs/endpoints.md), never the gate's "fail" (1).
            return getattr(exc, "exit_code", None) or (
                (2 if _refusal(exc, AUDIT_USAGE) else 4) if args.command == "audit" else 1)
        if isinstance(exc, OSError):  # a file that went away, a full disk, a name too long: one line
            where = f"{shown(exc.filename)}: " if exc.filename is not None else ""
            print(f"tokenflip {args.command}: error: {where}{exc.strerror or type(exc).__name__}", file=sys.stderr)
            return 4 if args.command == "audit" else 1
        if args.command != "audit":  # a defect: its traceback, and for a CI step "not measured", never "fail"
            raise
        __import__("traceback").print_exc()
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
