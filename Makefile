# Every target creates or refreshes .venv itself: a fresh clone needs only Python 3.11+ and Java 17.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(BIN)/python)

.PHONY: venv demo test bench bench-quick lint clean bytecode

venv: $(STAMP)

# Spark starts a Python worker per core, and each compiles the modules it imports when no
# bytecode is cached (PYTHONDONTWRITEBYTECODE, a fresh clone): compile ours once up front
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src > /dev/null

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP) bytecode
	$(BIN)/headrace demo $(DEMO_ARGS)

test: $(STAMP) bytecode
	$(BIN)/pytest -q $(PYTEST_ARGS)

bench: $(STAMP) bytecode
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

bench-quick: $(STAMP) bytecode
	$(BIN)/python benchmarks/run_all.py --quick

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
