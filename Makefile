# Developer entry points. Every target that runs project code first runs scripts/setup, which is
# idempotent and takes a few seconds when nothing changed.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast acceptance lint docs

setup:
	@bash scripts/setup

demo: setup
	$(VENV)/bin/otel-ttft demo

# The suite CI runs; the longest end-to-end checks (marker `acceptance`) are `make acceptance`.
test: setup
	$(PYTHON) -m pytest -q -m "not acceptance" tests $(PYTEST_ARGS)

acceptance: setup
	$(PYTHON) -m pytest -q -m acceptance tests $(PYTEST_ARGS)

test-fast: setup
	$(PYTHON) -m pytest -q -m "not vllm" tests $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check otel_ttft tests scripts benchmarks
	$(VENV)/bin/lint-imports --config .importlinter

# The documentation site (docs/, mkdocs.yml) into site/; strict: any warning fails the build.
# NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner (not a warning about the docs).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean -d site
