"""Results read back (compare.smk, report.smk's summaries): pairs compared per prompt, why
they parted, noise floors, verdicts with their statistics and power, the summary tables."""


class ResultError(ValueError):
    """A result file is not what the config asks for (stale, foreign, corrupt). Here, not in
    `summary`, so that catching it imports no pandas."""
