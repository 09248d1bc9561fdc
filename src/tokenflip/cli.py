"""`tokenflip` command line: what the Snakemake rules call, and what people call by hand.

Exit codes: 0 success, 1 usage or input error (message on stderr), 2 command-line syntax,
3 `diff-runs` found cells that differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _json_arg(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def cmd_prepare_model(args) -> None:
    from .models import prepare

    manifest = prepare(args.spec, args.out)
    print(json.dumps({k: manifest[k] for k in ("architecture", "num_parameters", "weights_sha256")}))


def cmd_run_cell(args) -> None:
    """One cell of a config, outside Snakemake: prepares the model if needed."""
    from pathlib import Path

    from . import config as cfg
    from .cell import run_cell
    from .models import prepare
    from .plan import cell_settings, expand_cells

    config = cfg.load(args.config)
    cells = {cell.id: cell for cell in expand_cells(config)}
    if args.cell not in cells:
        raise cfg.ConfigError(f"{args.config}: no cell {args.cell!r}; `tokenflip plan --config "
                              f"{args.config}` lists them")
    cell = cells[args.cell]
    model_dir = Path(args.models_dir) / cell.model
    if not (model_dir / "model.json").exists():
        prepare(config["models"][cell.model], model_dir)
    out = args.out or cell.path(config["run"])
    meta = run_cell(cell_settings(config, cell), model_dir, out, progress=not args.quiet)
    print(f"{out}: token-stream sha256 {meta['token_stream_sha256']}")


def cmd_generate(args) -> None:
    from .cell import run_cell

    meta = run_cell(args.settings, args.model_dir, args.out, progress=not args.quiet)
    print(f"{meta['cell_id']}: token-stream sha256 {meta['token_stream_sha256']}")


def cmd_probe(args) -> None:
    from .probes import kv_cache, precision

    probes = {"kv_cache": kv_cache.run_probe, "precision": precision.run_probe}
    name = args.settings.get("probe")
    if name not in probes:
        raise SystemExit(f"tokenflip probe: unknown probe {name!r}; known: {sorted(probes)}")
    probes[name](args.settings, args.model_dir, args.out_dir)
    print(f"probe written to {args.out_dir}")


def cmd_compare(args) -> None:
    from .compare import compare_files
    from .plan import Pair
    from .storage import read_metadata

    if args.pair_id:
        from .plan import pair_from_id
        pair = pair_from_id(args.pair_id)
    else:
        from .plan import Cell
        a, b = Cell.from_dict(read_metadata(args.a)["cell"]), Cell.from_dict(read_metadata(args.b)["cell"])
        axes = [ax for ax in ("precision", "cache", "batch_size", "decoding", "intervention")
                if a.value(ax) != b.value(ax)]
        pair = Pair(axes[0] if len(axes) == 1 else args.axis or "", a, b)
    meta = compare_files(pair, args.a, args.b, args.out)
    s = meta["summary"]
    print(f"{pair.label}: {s['n_diverged']}/{s['n_prompts']} prompts diverged "
          f"({100 * s['divergence_rate']:.1f}%, 95% CI {100 * s['divergence_ci_low']:.1f}-"
          f"{100 * s['divergence_ci_high']:.1f}%)")


def _plan(args):
    from . import config as cfg
    from .plan import expand_cells, expand_pairs

    if getattr(args, "config_json", None) is not None:
        config = cfg.validate(args.config_json, source="--config-json")
    else:
        config = cfg.load(args.config)
    cells = expand_cells(config)
    return config, cells, expand_pairs(config, cells)


def cmd_summarize(args) -> None:
    from .summary import write_summaries

    from .plan import probe_targets

    config, cells, pairs = _plan(args)
    write_summaries(cells, pairs, args.results, args.out_dir, probe_targets(config))


def cmd_report(args) -> None:
    from .report import render

    config, _, _ = _plan(args)
    print(render(args.summary_dir, args.out, config))


def cmd_digest(args) -> None:
    from .storage import read_metadata

    for path in args.cells:
        meta = read_metadata(path)
        print(f"{meta['token_stream_sha256']}  {path}")


def cmd_diff_runs(args) -> None:
    """Exit status 0 when every shared cell is bitwise identical, 3 when some differ."""
    from pathlib import Path

    from .compare import compare_tables
    from .storage import read_metadata, read_table

    roots = [Path(args.run_a) / "cells", Path(args.run_b) / "cells"]
    ids = [{str(p.relative_to(r))[: -len(".parquet")] for p in r.rglob("*.parquet")} for r in roots]
    shared = sorted(ids[0] & ids[1])
    if not shared:
        raise SystemExit(f"tokenflip diff-runs: no cell is in both {roots[0]} and {roots[1]}")
    differing = 0
    for cell_id in shared:
        paths = [r / f"{cell_id}.parquet" for r in roots]
        metas = [read_metadata(p) for p in paths]
        machines = " vs ".join(m["environment"]["device"]["name"] for m in metas)
        if metas[0]["token_stream_sha256"] == metas[1]["token_stream_sha256"]:
            same_logits = metas[0]["logits_sha256"] == metas[1]["logits_sha256"]
            print(f"identical  {cell_id}  (tokens{' and logits' if same_logits else ', logits differ'}; {machines})")
            continue
        differing += 1
        k = int(metas[0]["settings"]["record_top_k"])
        per_prompt = compare_tables(read_table(paths[0])[0], read_table(paths[1])[0], k).to_pandas()
        diverged = per_prompt[~per_prompt["identical"]]
        first = diverged.sort_values("first_div_step").iloc[0]
        print(f"DIFFERENT  {cell_id}  {len(diverged)}/{len(per_prompt)} prompts; earliest at step "
              f"{int(first['first_div_step'])} of {first['prompt_id']} ({machines})")
    only = sorted(ids[0] ^ ids[1])
    for cell_id in only:
        print(f"only in {'a' if cell_id in ids[0] else 'b'}  {cell_id}")
    print(f"{len(shared) - differing} identical, {differing} different, {len(only)} in one run only")
    if differing:
        raise SystemExit(3)


def cmd_plan(args) -> None:
    config, cells, pairs = _plan(args)
    for cell in cells:
        print(f"cell  {cell.id}")
    for pair in pairs:
        print(f"pair  {pair.id}")
    print(f"{len(cells)} cells, {len(pairs)} pairs", file=sys.stderr)


def _config_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--config", help="config YAML file")
    group.add_argument("--config-json", type=_json_arg, help="the config itself, as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenflip", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-model", help="convert a model once into a prepared directory")
    p.add_argument("--spec", type=_json_arg, required=True, help="model spec as JSON (a config 'models' entry)")
    p.add_argument("--out", required=True, help="directory to create")
    p.set_defaults(func=cmd_prepare_model)

    p = sub.add_parser("run-cell", help="run one cell of a config (no Snakemake), preparing its model if needed")
    p.add_argument("--config", required=True, help="config YAML file")
    p.add_argument("--cell", required=True, help="cell id, e.g. smollm2-135m/arithmetic/bf16-on-bs1-greedy-none")
    p.add_argument("--out", help="Parquet file to write (default: the pipeline's path under results/)")
    p.add_argument("--models-dir", default="resources/models", help="prepared models (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run_cell)

    p = sub.add_parser("generate", help="run one cell from its settings JSON (what the pipeline calls)")
    p.add_argument("--settings", type=_json_arg, required=True, help="cell settings as JSON")
    p.add_argument("--model-dir", required=True, help="prepared model directory")
    p.add_argument("--out", required=True, help="cell Parquet file to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("probe", help="run a mechanism probe for one model and benchmark")
    p.add_argument("--settings", type=_json_arg, required=True, help="probe settings as JSON")
    p.add_argument("--model-dir", required=True, help="prepared model directory")
    p.add_argument("--out-dir", required=True, help="directory for the probe's Parquet tables")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("compare", help="compare two cell files that differ in one axis")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--out", required=True, help="pair Parquet file to write")
    p.add_argument("--pair-id", help="pair id (model/benchmark/axis/a_vs_b/context), as the pipeline names it")
    p.add_argument("--axis", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("summarize", help="aggregate a run's cells and pairs into summary tables")
    _config_args(p)
    p.add_argument("--results", required=True, help="results/<run> directory")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("report", help="render the HTML report from summary tables")
    _config_args(p)
    p.add_argument("--summary-dir", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("digest", help="print the token-stream sha256 of cell files")
    p.add_argument("cells", nargs="+")
    p.set_defaults(func=cmd_digest)

    p = sub.add_parser("diff-runs", help="which cells of two run directories are bitwise identical, "
                                         "and where the others first differ (exit 3 if any differ)")
    p.add_argument("run_a", help="results/<run> directory (e.g. from a workstation)")
    p.add_argument("run_b", help="results/<run> directory (e.g. from a cluster)")
    p.set_defaults(func=cmd_diff_runs)

    p = sub.add_parser("plan", help="list the cells and pairs a config defines")
    _config_args(p)
    p.set_defaults(func=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .benchmarks import BenchmarkError
    from .compare import ComparabilityError
    from .config import ConfigError
    from .models import ModelError
    from .storage import StorageError

    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, StorageError, ComparabilityError, ModelError, BenchmarkError) as exc:
        print(f"tokenflip {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
