"""The GPU check's parts, one module per thing checked; perf/gpu_check.py runs them.

record       a part's record, deadlines, process groups, the transfer budget
models       the random models at the papers' widths
decode       part 1: the decode loop equals generate() bitwise
pipeline     part 2: a real Snakemake run of the pipeline, report included
perf_scripts part 3: the performance scripts, their figures parsed
divergence   part 4: cache on/off and bf16/fp16 divergences at 7B widths
environment  the versions of what ran
"""
