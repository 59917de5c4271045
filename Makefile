# incr — the two front-door commands are `make demo` and `make test` (`make lint` for the linters).
# Everything is installed into .venv from requirements.lock (exact versions); nothing else
# is assumed on the machine but Python 3.11 and Java 17.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint soak tpch demo explain bench clean

$(STAMP): requirements.lock pyproject.toml
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required for Spark (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	# incr serve compiles its read-only guard (a Spark extension) with the JDK's javac.
	@command -v javac >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null; } \
	  || { echo "error: a JDK 17 (javac) is required by incr serve (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# pyspark is a source archive built on first install (a few minutes); pip caches the wheel.
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $@

install: $(STAMP)

test: install
	$(BIN)/pytest -m "not slow"

# ruff over the whole repository, mypy over incr/compiler and incr/algebra (both configured in
# pyproject.toml).  Separate from `test`: CI runs both, a test run does not wait on the linters.
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

soak: install
	INCR_EQUIV_EXAMPLES=150 $(BIN)/pytest tests/runtime/test_equivalence.py tests/runtime/test_equivalence_nested.py
	INCR_KILLS=50 $(BIN)/pytest -s tests/runtime/test_sigkill.py
	INCR_KILLS=20 $(BIN)/pytest -s tests/orchestration/test_scheduler.py -k killed

tpch: install
	$(BIN)/pytest -m slow tests/runtime/test_tpch.py

demo: install
	$(BIN)/incr demo --out demo-out

explain: install
	$(BIN)/incr explain sql/examples/sales.sql

# A quick look (a few minutes): small runs of every benchmark into bench-out/.  The full
# runs behind docs/benchmarks.md are listed there.
bench: install
	$(BIN)/incr bench groupby --out bench-out --initial-rows 100000 --sizes 10000 --increments 5
	$(BIN)/incr bench joingroupby --out bench-out --initial-rows 20000 --sizes 2000 --increments 5
	$(BIN)/incr bench groupby-deletes --out bench-out --initial-rows 100000 --sizes 10000 --increments 6
	$(BIN)/incr bench kmeans --out bench-out --initial-rows 50000 --sizes 1000 --increments 3
	$(BIN)/incr bench pagerank --out bench-out --initial-rows 3000 --nodes 500 --new-nodes 20 --sizes 40 --increments 3

clean:
	rm -rf demo-out .pytest_cache
