# Target lists and per-job lookups, all from tokenflip: the plan (cells, pairs, probe
# jobs and their settings) and the layout (every path). Every per-job setting reaches a
# job through a lookup on its own wildcards, so adding a model or a benchmark adds jobs
# without touching old ones.
import json

from tokenflip.run.benchmarks import build_benchmark
from tokenflip.study.limits import longest_generation
from tokenflip.analysis.compare import PER_PROMPT_COLUMNS
from tokenflip.run.engines import engine as engine_of
from tokenflip.core.axes import AXES, cell_name_pattern
from tokenflip.core.specs import Cell, Pair
from tokenflip.core.layout import RunLayout
from tokenflip.study.plan import cell_job, expand_cells, expand_pairs, job_priorities, probe_job, probe_targets
from tokenflip.run.probes import PROBES
from tokenflip.analysis.summary import summary_tables
from tokenflip.analysis import rounds as tokenflip_rounds
from tokenflip.study.rounds import blocks_of, in_blocks, rounds_on, worst_case

LAYOUT = RunLayout(config["run"])
CELLS = expand_cells(config)
PAIRS = expand_pairs(config, CELLS)
CELL_FILES = [LAYOUT.cell(cell.id) for cell in CELLS]
PAIR_FILES = [LAYOUT.pair(pair.id) for pair in PAIRS]
PROBE_FILES = [LAYOUT.probe_table(probe, model, bench, table)
               for probe, model, bench in probe_targets(config) for table in PROBES[probe].tables]
SUMMARIES = [LAYOUT.summary(name) for name in summary_tables()]
REPORT = LAYOUT.report
PARTIAL_LOG = LAYOUT.log("report", "partial")
# The validated config; summaries and the report rerun when it changes.
CONFIG_JSON = json.dumps(config, sort_keys=True)


wildcard_constraints:
    model=r"[A-Za-z0-9_][A-Za-z0-9_.-]*",
    benchmark=r"[A-Za-z0-9_][A-Za-z0-9_.-]*",
    cell=cell_name_pattern(),
    axis="|".join(AXES),
    a=r"[A-Za-z0-9_.]+",
    b=r"[A-Za-z0-9_.]+",
    context=r"[A-Za-z0-9_.=-]+",
    first=r"\d+",
    end=r"\d+|end",
    round=r"\d+",


def cell_of(wildcards):
    return Cell.from_name(wildcards.model, wildcards.benchmark, wildcards.cell)


PRIORITIES = job_priorities(config, CELLS, PAIRS)


def generate_priority(wildcards):
    """Cache-off cells first (the longest jobs), then the cells the probes wait on."""
    return PRIORITIES.get(cell_of(wildcards).id, 0)


def compare_priority(wildcards):
    return PRIORITIES.get(pair_of(wildcards).id, 0)


def cell_job_json(wildcards):
    return cell_job(config, cell_of(wildcards)).dumps()


def block_job_json(wildcards):
    """A block's job: the cell's for its prompts only (the same whatever the study's n)."""
    end = None if wildcards.end == "end" else int(wildcards.end)
    return cell_job(config, cell_of(wildcards)).block(int(wildcards.first), end).dumps()


BLOCKS = in_blocks(config)
BLOCKS_PLAN = json.dumps({"blocks": {name: blocks_of(config, name) for name in config["benchmarks"]},
                          "rounds": config.get("rounds"), "margin": config["verdict"]["margin"]}, sort_keys=True)
# Rounds: each round's decisions (checkpoint `decide_round`) name the cells that go on to
# the next block; a cell's file joins the blocks its rounds took.
JUDGED = tokenflip_rounds.judged_pairs(PAIRS) if rounds_on(config) else []
JUDGED_CELLS = set(tokenflip_rounds.cells_of(JUDGED))
# Said once a run: Snakemake reads this file again in every job's process and after each
# round's checkpoint, and they inherit the variable.
if rounds_on(config) and not os.environ.get("TOKENFLIP_ROUNDS_SAID"):
    _worst = worst_case(config, CELLS)
    print(f"tokenflip: rounds: at most {_worst['rounds']} rounds, {_worst['blocks']} blocks, {_worst['prompts']} "
          f"prompts in all (when no comparison is decided before its maximum); a dry run lists the first round's "
          f"jobs, each later round's once the one before has decided", file=sys.stderr)
    os.environ["TOKENFLIP_ROUNDS_SAID"] = "1"


def round_record(number):
    """What round `number` decided (Snakemake runs its checkpoint first)."""
    with open(checkpoints.decide_round.get(round=str(number)).output[0]) as handle:
        return json.load(handle)


def block_list(cell):
    """The blocks of `cell` this study generates, as (path, first, end): all of them, or in
    a study of rounds those of the rounds the cell took part in."""
    blocks = blocks_of(config, cell.benchmark)
    if rounds_on(config) and cell.id in JUDGED_CELLS:  # a cell no round judges takes every block
        taken = 1
        while taken < len(blocks) and cell.id in round_record(taken)["continue"]:
            taken += 1
        blocks = blocks[:taken]
    return [(LAYOUT.block(cell.id, first, end), first, end) for first, end in blocks]


def cell_blocks(wildcards):
    return [path for path, _, _ in block_list(cell_of(wildcards))]


def round_inputs(wildcards):
    """What round N reads: the blocks so far of every cell of a comparison still open, and
    the round before's decisions."""
    number = int(wildcards.round)
    previous = round_record(number - 1) if number > 1 else None
    open_ = set(previous["open"]) if previous else None
    still = [(p, f) for p, f in JUDGED if open_ is None or p.id in open_]
    ids = set(tokenflip_rounds.cells_of(still))
    blocks = [LAYOUT.block(cell.id, first, end) for cell in CELLS if cell.id in ids
              for first, end in blocks_of(config, cell.benchmark)[:number]]
    return {"blocks": blocks, "previous": [LAYOUT.round(number - 1)] if number > 1 else []}


def round_question(wildcards):
    return json.dumps(tokenflip_rounds.question(config, JUDGED, int(wildcards.round), len(PAIRS)), sort_keys=True)


def benchmark_spec_json(wildcards):
    """The benchmark entry without max_new_tokens: what its prompts depend on."""
    spec = {k: v for k, v in config["benchmarks"][wildcards.benchmark].items() if k != "max_new_tokens"}
    return json.dumps(spec, sort_keys=True)


def benchmark_files(wildcards):
    """The local data files of the benchmark: an edited one reruns its cells."""
    return build_benchmark(wildcards.benchmark, config["benchmarks"][wildcards.benchmark]).data_files()


def model_spec_json(wildcards):
    return json.dumps(config["models"][wildcards.model], sort_keys=True)


def pair_of(wildcards):
    return Pair.from_parts(wildcards.model, wildcards.benchmark, wildcards.axis, wildcards.a, wildcards.b,
                           wildcards.context)


def pair_inputs(wildcards):
    pair = pair_of(wildcards)
    return {"a": LAYOUT.cell(pair.a.id), "b": LAYOUT.cell(pair.b.id)}


def pair_id(wildcards):
    return pair_of(wildcards).id


_PROBE_JOBS = {}


def _probe_job(probe, wildcards):
    """A probe job, made once (its params and its inputs both need it)."""
    key = (probe, wildcards.model, wildcards.benchmark)
    if key not in _PROBE_JOBS:
        _PROBE_JOBS[key] = probe_job(config, *key, PAIRS)
    return _PROBE_JOBS[key]


def probe_job_json(probe):
    def lookup(wildcards):
        return _probe_job(probe, wildcards).dumps()
    return lookup


def probe_pair_files(probe):
    """The pair results a probe job chooses its prompts from (none with `select: first`)."""
    def lookup(wildcards):
        return [LAYOUT.pair(pair_id) for pair_id in _probe_job(probe, wildcards).explains]
    return lookup


def probe_out_dir(probe):
    def lookup(wildcards):
        return LAYOUT.probe_dir(probe, wildcards.model, wildcards.benchmark)
    return lookup


def job_device(wildcards):
    """Where a generation or probe job runs: the device its job spec names (the cell's
    device axis, else the run's `generation.device`, as the cell's engine resolves it);
    `auto` means CUDA when this machine has it."""
    if "cell" in wildcards.keys():
        device = cell_job(config, cell_of(wildcards)).device
    else:
        device = config["generation"]["device"]
    return ("cuda" if accelerator_present() else "cpu") if device == "auto" else device


def accelerator_present():
    """Whether this machine has an NVIDIA GPU (without importing torch)."""
    return os.path.exists("/dev/nvidiactl") or bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip(" -1"))


def generate_threads(wildcards):
    """The cores a job holds: its job spec's threads (the cell's threads axis, else
    `generation.threads`), else on a GPU every core Snakemake was given, and on a CPU one
    core per job, so that CPU jobs run side by side and each one's CPU time is its own."""
    cell = cell_of(wildcards) if "cell" in wildcards.keys() else None
    threads = cell_job(config, cell).threads if cell is not None else config["generation"]["threads"]
    if threads is None:
        threads = workflow.cores if job_device(wildcards) == "cuda" else 1
    return engine_of(cell.engine, config).job_threads(cell, threads, workflow.cores) if cell is not None else threads


# Cells of live endpoints take turns (one at a time unless `--resources endpoint_traffic=N`):
# the requests a server sees during a cell are that cell's own and its load's, never another
# cell's. They hold no `gpu` token, so they run beside the local cells.
if "endpoint_traffic" not in workflow.global_resources:
    workflow.register_resource("endpoint_traffic", 1)


def endpoint_tokens(wildcards):
    return 1 if cell_of(wildcards).engine in config.get("endpoints", {}) else 0


def gpu_tokens(wildcards):
    """One `gpu` token per job on an accelerator (so that `--resources gpu=N` bounds them);
    none on a CPU, where the token would only serialise jobs that can share the cores."""
    return 1 if job_device(wildcards) == "cuda" else 0
