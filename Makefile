# Two entry points for a fresh machine: `make demo` and `make test`. Both build the same
# virtual environment first (torch with CUDA so CUDA extensions compile even without a GPU).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.forge-pack-installed
TORCH ?= torch==2.14.1
DEMO_MODEL ?= tests/models/norm_head.py

# `make test-gpu` and `make mutation` use the venv's python when there is one; `PYTHON=python3 make test-gpu`
# (the H200 image) uses that interpreter as it is, with no venv built.
RUN_PY = $(if $(OWN_PY),$(PYTHON),$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)))
MUTMUT ?= $(if $(findstring /,$(RUN_PY)),$(dir $(RUN_PY))mutmut,mutmut)
OWN_PY = $(filter command line environment,$(origin PYTHON))

.PHONY: demo test test-fast test-ray test-gpu mutation mutation-check venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,dev,ray]"
	touch $(STAMP)

# profile → search → confirm → package, pip install it here, apply it, print before/after.
demo: $(STAMP)
	rm -rf runs/demo out/demo_package
	$(BIN)/python -m forge_pack.cli.demo $(DEMO_MODEL) --device cpu --budget 5 --out out/demo_package --run-dir runs/demo

# `--durations`: the CI log lists the slowest tests (the aim: the whole run under ~20 minutes).
# `-n`: one pytest worker per core (pytest-xdist, at most TEST_WORKERS); `--dist loadscope` keeps a
# module's tests on one worker, so a module fixture (a built package) is built once;
# `--no-loadscope-reorder`: the modules in the order tests/conftest.py gives them (long ones first,
# tests/xdist_schedule.py).
TEST_WORKERS ?= 4
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=30 -n auto --maxprocesses $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# The fast path: everything but the tests marked slow (see README, docs/testing.md).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The Ray tests alone (a local Ray cluster on the CPU). `make test` runs them too: the ray extra is in
# the venv (13 s to install from the package mirror on the 2-core CI machine, under the 60 s allowed
# for an extra), in a pytest process of their own (tests/test_ray_pool.py runs tests/ray_pool_cases.py),
# and skip themselves where Ray is missing.
test-ray: $(STAMP)
	$(BIN)/python -m pytest -q tests/ray_pool_cases.py

# On a GPU machine: every gpu test, the CUDA anti-cheat fixtures first, a skip is a failure;
# writes bench/results/test-gpu.md.
test-gpu:
	PYTHON=$(RUN_PY) bash bench/test_gpu.sh

# Mutation testing of the trust core (mutmut, the `dev` extra): all scoped modules, then
# bench/results/mutation.md from the results. Long (tens of minutes on 2 cores).
mutation: $(if $(OWN_PY),,$(STAMP))
	PYTHON=$(RUN_PY) MUTMUT=$(MUTMUT) bash bench/mutation.sh

# The CI guard (also run by `make test` through tests/test_mutation_guard.py): re-run mutation on the
# fast modules and fail if a score is below the committed bench/results/mutation.json.
mutation-check: $(if $(OWN_PY),,$(STAMP))
	PYTHON=$(RUN_PY) MUTMUT=$(MUTMUT) bash bench/mutation.sh --check

clean:
	rm -rf $(VENV) runs out build mutants *.egg-info
