# Two commands do all set-up on a fresh machine:
#   make run    the workflow on the built-in local configuration (snakemake --profile profiles/local)
#   make test   the test suite (unit, workflow, and Slurm tests on a real test cluster)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint dag system-deps clean gpu-check

# The venv: this package with its test extra, then the GPU jobs' Megatron Core, whose wheel
# says Requires-Python >= 3.12: on Python 3.11 pip installs it only past that check (on
# 3.12 pyproject's train extra has it; src/hpcllm/models/megatron_compat.py says why).
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	if $(BIN)/python -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then \
		$(BIN)/pip install -q --no-deps --ignore-requires-python megatron-core==0.19.0; fi
	touch $@

run: $(BIN)/.installed
	$(BIN)/snakemake --profile profiles/local

system-deps:
	bash scripts/install-system-deps.sh

# The suite mostly waits (Slurm jobs, Snakemake runs): it runs on TEST_WORKERS pytest-xdist
# workers (tests/conftest.py keeps a shared fixture's tests on one worker and hands out the
# long tests first) and prints its 15 slowest tests at the end.
TEST_WORKERS ?= 4
test: $(BIN)/.installed system-deps
	$(BIN)/pytest -ra -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	$(BIN)/ruff format --check src tests benchmarks workflow/scripts
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint

# The pictures of the plan (one box per rule; the jobs) need Graphviz's dot: installed with apt when root, else the script says so.
dag: $(BIN)/.installed
	@command -v dot >/dev/null || bash scripts/install-system-deps.sh graphviz
	@command -v dot >/dev/null || { echo "make dag needs Graphviz's dot (package graphviz)" >&2; exit 1; }
	$(BIN)/snakemake --profile profiles/local --rulegraph | dot -Tsvg > rules.svg
	$(BIN)/snakemake --profile profiles/local --dag | $(BIN)/hpcllm dag | dot -Tsvg > dag.svg

clean:
	rm -rf data results logs checkpoints plots report.html .snakemake

# The whole GPU path on this machine, one table (docs/gpu-check.md). With
# HPCLLM_PYTHON=python3 (a GPU machine whose Python already holds torch) it runs with that
# Python and this checkout's src/, without .venv; GPU_CHECK_ARGS passes options
# (--megatron PATH, --out DIR, --only STEP ...).
HPCLLM_PYTHON ?=
gpu-check: $(if $(HPCLLM_PYTHON),,$(BIN)/.installed)
	PYTHONPATH=$(CURDIR)/src$(if $(PYTHONPATH),:$(PYTHONPATH)) $(or $(HPCLLM_PYTHON),$(BIN)/python) -m hpcllm.gpu_check $(GPU_CHECK_ARGS)
