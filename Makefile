# Two commands for a fresh clone: `make run` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run report test install lint typecheck unit wrk clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Start simulated GPU, ASIC and CIM pools and the gateway on 127.0.0.1:8080; Ctrl-C stops all.
run: install
	VENV=$(VENV) bash scripts/run-local.sh

## A demo week of traffic through the real gateway, rendered to reports/demo/report.html.
report: install
	$(PY) scripts/demo_report.py

## Install what the tests need, then lint, type-check and run the whole suite.
test: install lint typecheck unit

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

## Best effort: tests/test_performance.py needs wrk (Debian package) and skips without it.
wrk:
	-@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get install -y -qq wrk >/dev/null 2>&1 \
	       || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq wrk >/dev/null 2>&1; }; }; } \
	  || echo "wrk is not installed: tests/test_performance.py will skip"

unit: install wrk
	$(PY) -m pytest

clean:
	rm -rf $(VENV) run gateway.db .pytest_cache .mypy_cache .ruff_cache
