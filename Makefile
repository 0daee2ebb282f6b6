# Two commands for a newcomer: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-slow lint format ui install java system-deps bench clean \
	spark-start spark-stop

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv

.venv/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --extra platform --compile-bytecode
	touch $@

# Bytecode compiled once, at install (`--compile-bytecode`) and for Sluice's own packages before
# each command: where PYTHONDONTWRITEBYTECODE is set (this machine, many CI images) Python
# writes no .pyc, and every process (each job's driver, each Spark Python worker and planner)
# compiled every module it imports again: `import pandas` took 2.3 s instead of 0.75 s, and a
# short `sluice run mirror` 36 s instead of 22 s. compileall skips what is up to date. Spark's
# Python processes import pyspark from pyspark.zip, which holds source only: zip_bytecode adds
# the bytecode to it once (pipeline/spark/zip_bytecode.py).
install: .venv/.installed
	@$(PY) -m compileall -q -j 0 pipeline collectors assets resources tests benchmarks >/dev/null
	@$(PY) -m pipeline.spark.zip_bytecode

# Spark needs Java 17+. Install it with apt-get when it is missing and we can; else say how.
java:
	@if ! command -v java >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing Java 17 for Spark (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "error: Spark needs Java 17: install openjdk-17-jre-headless (or set JAVA_HOME) and re-run" >&2; exit 1; \
	  fi; \
	fi

# Test-only system services: mosquitto (MQTT collector), Chromium (browser test of the Dagster
# UI) and PostgreSQL (the docker/ deployment's Dagster storage, tests/deploy/).
system-deps:
	@missing=""; \
	command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing$$missing (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "warning:$$missing not installed: the tests that need them are skipped" >&2; \
	  fi; \
	fi

# A warm Spark (Spark Connect on loopback) that every job of $$SLUICE_HOME attaches to instead
# of starting a JVM of its own; `demo` and `ui` start it and stop it when they end (one that
# runs for the home already is used and left running).
# WARM_SPARK=0 leaves it out (each job then starts a local Spark, as without it).
WARM_SPARK ?= 1

spark-start: install java
	$(PY) -m pipeline.cli spark start

spark-stop:
	$(PY) -m pipeline.cli spark stop

# The demo starts (and stops) the warm Spark itself, after checking the home, and stops all it
# started on Ctrl-C or SIGTERM; it is the recipe's only process, so make's signals reach it.
demo: install java
	$(PY) -m pipeline.demo $(if $(filter 1,$(WARM_SPARK)),--warm-spark) $(DEMO_ARGS)

test: install java system-deps
	$(PY) -m ruff check .
	.venv/bin/lint-imports
	$(PY) -m pytest -m "not slow" -n 2 --durations=8 $(PYTEST_ARGS)
	$(PY) -m pytest -m slow -n 2 --maxschedchunk 1 --durations=12 $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" -x $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m slow -n 2 --maxschedchunk 1 --durations=12 $(PYTEST_ARGS)

# ruff, then the import contracts in pyproject.toml (layers, backends, edge install, no cycles).
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Dagster on the demo's instance ($SLUICE_HOME/dagster): its runs, pools and run queue.
# The warm run worker (assets/run_worker.py) forks the runs; it, and the warm Spark unless it
# ran before, stop with `dagster dev` (one EXIT trap: a second `trap ... EXIT` replaces the first).
ui: install java
	spark_stop=:; if [ "$(WARM_SPARK)" = 1 ] && ! $(PY) -m pipeline.cli spark status >/dev/null; then \
	  $(PY) -m pipeline.cli spark start >/dev/null && spark_stop='$(PY) -m pipeline.cli spark stop >/dev/null'; \
	fi; export DAGSTER_HOME=$$($(PY) -m assets.instance); \
	$(PY) -m assets.run_worker & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; eval "$$spark_stop"; spark_stop=:' EXIT INT TERM; \
	.venv/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# Every benchmark, each writing its section of benchmarks/RESULTS.md (benchmarks/results.py).
BENCHMARKS := store read_floor slices mirror export replay collectors join cluster bytecode
bench: install java
	for b in $(BENCHMARKS); do $(PY) benchmarks/$$b.py --write-results || exit 1; done

clean:
	rm -rf .sluice test-artifacts
