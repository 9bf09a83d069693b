# Two commands: `make run` and `make test` (README quick start). Everything else is plumbing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# test files run on this many cores side by side (pytest-xdist; 0: one process)
PYTEST_WORKERS ?= 2

.PHONY: run test lint install browser clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints/ci.txt
	$(BIN)/python -m pip install -q -c constraints/ci.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser tests (never `playwright install`); the tests drive exactly
# /usr/bin/chromium, so that is what is checked (a chromium elsewhere on PATH does not count).
browser:
	@[ -x /usr/bin/chromium ] || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "error: could not install Debian chromium (needed by the browser tests)"; exit 1; }; }

run: $(STAMP)
	$(BIN)/dreamrt serve --host $(HOST) --port $(PORT)

# The checks configured in pyproject.toml: ruff (lint rules and the formatter's check), mypy
# (the product packages' and infra/'s types; strict on runtime/ and sessions/) and import-linter
# (the layers and the edges the packages keep: [tool.importlinter]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Files go to the workers whole, in the order tests/conftest.py puts them (files marked `first`,
# the longest setups, start at once instead of last: xdist's default sorts files by test count).
test: lint browser
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
