# specserve: the two fresh-machine commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test test-slow lint demo engine repo serve bench bench-runtime soak clean help

help:
	@echo "make demo   - install, build the demo model + engine, serve on Triton, benchmark, report"
	@echo "make test   - install and run the test suite"
	@echo "make lint   - ruff + mypy"

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,server]'
	@touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check specserve tests benchmarks
	$(BIN)/mypy

demo: setup
	@echo "make demo: not built yet (issue 8)"; exit 1

engine: setup
	@echo "make engine: not built yet (issue 3)"; exit 1

repo: setup
	@echo "make repo: not built yet (issue 4)"; exit 1

serve: setup
	@echo "make serve: not built yet (issue 4)"; exit 1

bench: setup
	@echo "make bench: not built yet (issue 5)"; exit 1

bench-runtime: setup
	@echo "make bench-runtime: not built yet (issue 9)"; exit 1

soak: setup
	@echo "make soak: not built yet (issue 7)"; exit 1

clean:
	rm -rf engines triton_repo reports .pytest_cache .mypy_cache .ruff_cache
