# GeoSense: `make run` serves the app, `make test` runs every test. Both work on a fresh clone;
# `make help` lists every target.

HOST ?= 127.0.0.1
PORT ?= 8000
VENV := .venv
BIN := $(VENV)/bin
# The interpreters tried in order when PYTHON names none (scripts/find-python checks each).
PYTHON_CANDIDATES := python3.13 python3.12 python3.11 python3
# uv installs the exact versions of uv.lock; it comes from PyPI, pinned, into the venv.
UV_VERSION := 0.13.9
UV := $(BIN)/uv

# uv: never download an interpreter (only the package registries are reached), and always
# work on this checkout's .venv whatever the caller's shell has active.
export UV_PYTHON_DOWNLOADS := never
unexport UV_PROJECT_ENVIRONMENT VIRTUAL_ENV
# Python's default, bytecode cached in __pycache__: some images set PYTHONDONTWRITEBYTECODE,
# and then every manage.py, Daphne and test process compiles Django and numpy again (a start
# takes about three times as long).
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help
.PHONY: help run test lint lock demo-reset clean

help: ## list the targets
	@echo "GeoSense: make TARGET [HOST=127.0.0.1] [PORT=8000] [PYTHON=python3.12]"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: $(VENV)/.installed ## serve the app on http://HOST:PORT (writes .env and the demo data first)
	@$(BIN)/python -m geosense.envfile
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	@echo
	@echo "GeoSense is at http://$(HOST):$(PORT)/ (log in as demo / demo; Ctrl-C stops it)"
	@$(BIN)/python manage.py local_admin --url http://$(HOST):$(PORT)/
	@echo
	$(BIN)/python -m geosense.serve -b $(HOST) -p $(PORT) geosense.asgi:application

test: $(VENV)/.installed-test lint ## ruff, then every test (pytest, browser tests included; node)
	$(BIN)/pytest
	@if ls tests/js/*.test.mjs >/dev/null 2>&1; then node --test tests/js/*.test.mjs; fi

lint: $(VENV)/.installed-test ## ruff check and ruff format --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lock: $(UV) ## re-resolve uv.lock after editing pyproject.toml's dependencies (commit both)
	$(UV) lock

demo-reset: $(VENV)/.installed ## restore the demo annotations, demo's password and its 100 credits
	@$(BIN)/python -m geosense.envfile
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo --reset

clean: ## remove .venv and the caches (keeps .env and db.sqlite3)
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis geosense.egg-info

# The venv gets no pip of its own (ensurepip takes seconds): uv installs everything else.
$(BIN)/python:
	@python=$$(scripts/find-python $(or $(PYTHON),$(PYTHON_CANDIDATES))) || exit 1; \
	echo "Creating $(VENV) with $$python"; \
	"$$python" -m venv --without-pip $(VENV)

# uv into the venv with the interpreter's own pip (`pip --python`), or, where it has none or
# too old a one, with a pip the venv gets from ensurepip.
$(UV): | $(BIN)/python
	@echo "Installing uv $(UV_VERSION) into $(VENV)"
	@base=$$($(BIN)/python -c 'import sys; print(sys._base_executable)'); \
	"$$base" -m pip --python $(BIN)/python install $(PIP_QUIET) uv==$(UV_VERSION) 2>/dev/null \
	|| { $(BIN)/python -m ensurepip --default-pip >/dev/null \
	     && $(BIN)/python -m pip install $(PIP_QUIET) uv==$(UV_VERSION); }

PIP_QUIET := --quiet --disable-pip-version-check

# The venv is synced with uv.lock whenever it or pyproject.toml changes. `--locked` stops with
# an error when the two disagree, so a stale lock never ships: `make lock` updates it.
# `--inexact` keeps what the other target installed (the test extras, pip and uv themselves).
$(VENV)/.installed: pyproject.toml uv.lock | $(UV)
	@$(UV) sync --locked --inexact || { $(LOCK_HELP); exit 1; }
	@touch $@

$(VENV)/.installed-test: pyproject.toml uv.lock | $(UV)
	@$(UV) sync --locked --inexact --extra test || { $(LOCK_HELP); exit 1; }
	@touch $@

LOCK_HELP = $(UV) lock --check >/dev/null 2>&1 || echo "uv.lock does not match pyproject.toml: \
run 'make lock' and commit uv.lock with your change." >&2
