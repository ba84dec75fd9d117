# Every target creates or refreshes .venv itself: a fresh clone needs only Python 3.11+ and Java 17.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(BIN)/python)

.PHONY: venv demo test bench bench-quick lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/headrace demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --quick

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
