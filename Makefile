# incr — the two front-door commands are `make demo` and `make test`.
# Everything is installed into .venv from requirements.lock (exact versions); nothing else
# is assumed on the machine but Python 3.11 and Java 17.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test soak tpch demo explain clean

$(STAMP): requirements.lock pyproject.toml
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required for Spark (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# pyspark is a source archive built on first install (a few minutes); pip caches the wheel.
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $@

install: $(STAMP)

test: install
	$(BIN)/pytest -m "not slow"

soak: install
	INCR_EQUIV_EXAMPLES=150 $(BIN)/pytest tests/runtime/test_equivalence.py

tpch: install
	$(BIN)/pytest -m slow tests/runtime/test_tpch.py

demo: install
	$(BIN)/incr demo --out demo-out

explain: install
	$(BIN)/incr explain sql/examples/sales.sql

clean:
	rm -rf demo-out .pytest_cache
