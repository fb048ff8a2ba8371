# GeoSense: `make run` serves the app, `make test` runs every test. Both work on a fresh clone.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

# The dev server runs on the embedded defaults, which the settings allow only with DEBUG on.
run: export DEBUG ?= 1

.PHONY: run test lint

run: $(VENV)/.installed
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	@echo
	@echo "GeoSense is at http://$(HOST):$(PORT)/ (log in as demo / demo; Ctrl-C stops it)"
	@echo
	$(BIN)/daphne -b $(HOST) -p $(PORT) geosense.asgi:application

test: $(VENV)/.installed-test lint
	$(BIN)/pytest
	@if ls tests/js/*.test.mjs >/dev/null 2>&1; then node --test tests/js/*.test.mjs; fi

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@
