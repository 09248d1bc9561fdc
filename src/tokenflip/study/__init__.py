"""A study as its config asks (common.smk): the config and its schema, the size limits, the
plan of cells, pairs and probes with its checks, and what the study will cost."""
