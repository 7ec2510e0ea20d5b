# Two commands for a fresh clone: `make run` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test install lint typecheck unit clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Start simulated GPU, ASIC and CIM pools and the gateway on 127.0.0.1:8080; Ctrl-C stops all.
run: install
	VENV=$(VENV) bash scripts/run-local.sh

## Install what the tests need, then lint, type-check and run the whole suite.
test: install lint typecheck unit

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest

clean:
	rm -rf $(VENV) run gateway.db .pytest_cache .mypy_cache .ruff_cache
