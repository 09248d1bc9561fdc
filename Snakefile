# tokenflip's workflow ships inside the package (src/tokenflip/workflow/Snakefile), so that an
# installed wheel runs it (`tokenflip run CONFIG`); this file runs it from a checkout:
#   snakemake --cores all --resources gpu=1 [--configfile my-study.yaml]
include: "src/tokenflip/workflow/Snakefile"
# An included file's default target is not the including file's: the report is.
workflow.default_target = "all"
