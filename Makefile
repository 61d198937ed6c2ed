# One command each: install, check (lint + types), test, run.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: install check test unit integration run clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first: any other torch spec may pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[worker,dev]'
	touch $@

check: install
	$(BIN)/ruff check .
	$(BIN)/mypy api scheduler gpu_worker shared fusefleet bench

test: install
	$(BIN)/pytest

unit: install
	$(BIN)/pytest tests/unit

integration: install
	$(BIN)/pytest tests/integration

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

run: install
	$(BIN)/fusefleet up
