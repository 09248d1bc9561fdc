"""`tokenflip run CONFIG`: a study through Snakemake with the workflow that ships inside the
package (its Snakefile, rules, report caption and profiles: `tokenflip/workflow`), from any
directory, the run's results/, reports/, resources/ and logs/ in it. What `make run` does in a
checkout, after `pip install` of the wheel, as a CI image installs tools. The audit runs the
same Snakefile (`snakefile()`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROFILES = ("default", "workstation", "slurm")


def workflow_dir() -> Path:
    """The installed package's workflow: its Snakefile, rules/, report/ and profiles/."""
    from importlib import resources

    return Path(str(resources.files("tokenflip") / "workflow"))


def snakefile() -> Path:
    return workflow_dir() / "Snakefile"


def snakemake_command(config: str | Path, cores: int | str, profile: str = "default", *extra: str) -> list[str]:
    """The Snakemake command line of a study here: the packaged Snakefile and rerun policy
    (its default workflow profile), and a profile's settings or this machine's cores and one
    GPU token."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile()), "--directory", str(Path.cwd()),
               "--configfile", str(config), "--workflow-profile", str(workflow_dir() / "profiles" / "default")]
    if profile != "default":
        return [*command, "--profile", str(workflow_dir() / "profiles" / profile), *extra]
    return [*command, *extra, "--cores", str(cores), "--resources", "gpu=1"]


def cmd_run(args) -> None:
    """Validate the study first (one line naming what is wrong, before Snakemake starts), then
    run it; Snakemake's own exit code is the command's."""
    from tokenflip.study.config import read_yaml, validate

    validate(read_yaml(args.config), source=str(args.config))
    extra = [*(["--dry-run"] if args.dry_run else []), *args.snakemake]
    code = subprocess.call(snakemake_command(args.config, args.cores, args.profile, *extra))
    if code:
        raise SystemExit(code)


def add_command(sub) -> None:
    from tokenflip.cli.args import cores, path_arg, snakemake_options

    p = sub.add_parser("run", help="run a study through Snakemake with the workflow installed with tokenflip, from "
                                   "any directory (results/, reports/ here): what `make run` does in a checkout")
    path_arg(p, "config", kind="config", help="the study's config file (config/config.yaml is the default study)")
    p.add_argument("--cores", default="all", type=cores, help="the cores Snakemake may use (default: all)")
    p.add_argument("--profile", choices=PROFILES, default="default",
                   help="a shipped profile: slurm submits each job to SLURM (edit a copy of it for your cluster: "
                        "`snakemake --profile DIR` with the packaged Snakefile), workstation several GPUs")
    p.add_argument("--dry-run", action="store_true", help="list the jobs that would run and why")
    p.add_argument("--snakemake", type=snakemake_options, default=[], metavar="OPTIONS",
                   help="more Snakemake options, as one quoted string ('--keep-going --until prepare_model')")
    p.set_defaults(func=cmd_run)
