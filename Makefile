# One command each: install, check (lint + types), test, run.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3
# a local CPU wheel of torch, where the machine has one
TORCH_WHEELS ?= /opt/wheels

.PHONY: install check pre-commit test unit integration chaos soak run clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first: any other torch spec may pull a multi-GB CUDA build
	$(BIN)/pip install -q $(if $(wildcard $(TORCH_WHEELS)),--find-links $(TORCH_WHEELS)) torch==2.13.0
	$(BIN)/pip install -q -e '.[worker,dev]'
	touch $@

check: install
	$(BIN)/ruff check .
	$(BIN)/mypy api scheduler gpu_worker shared fusefleet demo_models bench

# git runs check's ruff and mypy before each commit (.pre-commit-config.yaml, local hooks: nothing fetched)
pre-commit: install
	$(BIN)/pip install -q pre-commit
	$(BIN)/pre-commit install

# two pytest processes, whole files each (--dist loadfile: a file's module fixtures start once), so the tests that
# wait on real processes overlap; TEST_PROCESSES=0 runs them in one process
TEST_PROCESSES ?= 2

test: install
	$(BIN)/pytest $(if $(filter-out 0,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)

unit: install
	$(BIN)/pytest tests/unit

integration: install
	$(BIN)/pytest tests/integration

# faults on real processes (Redis killed or stopped, scheduler killed, lost messages, soak); also part of `test`
chaos: install
	$(BIN)/pytest -m chaos

# the tests that run over a minute each (deselected from `test`, so CI stays within its budget)
soak: install
	$(BIN)/pytest -m soak

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

run: install
	$(BIN)/fusefleet up
