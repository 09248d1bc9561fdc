"""The warm process of shared model loads (`tokenflip.run.shared_loads`), started as
`python -m tokenflip.cli.warm_load ADDRESS` by the first job of its load (`cli.generate`):
it runs each job handed to it as `tokenflip generate` would, its refusals the same one line
and exit status."""

from __future__ import annotations

import sys


def run_generate(argv: list[str]) -> int:
    """One handed-over job: `tokenflip generate ARGV`'s exit status, in this process."""
    from tokenflip.cli.main import build_parser, run_command

    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    from tokenflip.run.shared_loads import serve

    serve(sys.argv[1], run_generate)
