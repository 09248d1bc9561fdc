"""Results read back (compare.smk, report.smk's summaries): pairs compared per prompt, why
they parted, noise floors, verdicts with their statistics and power, the summary tables."""
