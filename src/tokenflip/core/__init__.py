"""What every stage shares and nothing above it changes: the table of axes, the cell, pair
and job types, the registry of extension kinds, the run's layout (every path), Parquet
storage with its digests, provenance and the CPU's kernel flags, checked literals and
command-line input files, and the watch that stops a job whose scheduler is gone."""
