# Two entry points for a fresh machine: `make demo` and `make test`. Both build the same
# virtual environment first (torch with CUDA so CUDA extensions compile even without a GPU).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.forge-pack-installed
TORCH ?= torch==2.14.1
DEMO_MODEL ?= tests/models/vision_net.py

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

# profile → search → confirm → package, pip install it here, apply it, print before/after.
demo: $(STAMP)
	rm -rf runs/demo out/demo_package
	$(BIN)/python -m forge_pack.demo $(DEMO_MODEL) --device cpu --budget 8 --out out/demo_package --run-dir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs out build *.egg-info
