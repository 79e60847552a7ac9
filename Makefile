# The two quick-start commands: `make demo` and `make test`.
# Both create .venv and install the project (CPU torch pinned explicitly) on first use.
# `make demo` runs the consortium of services/ end to end (services/demo.sh); `make demo-sim` the in-process
# simulation on a synthetic graph that `make demo` ran before.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH_VERSION := 2.13.0

.PHONY: demo demo-sim test install lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	FEDGL=$(VENV)/bin/fedgl-secure bash services/demo.sh

demo-sim: $(STAMP)
	$(VENV)/bin/fedgl-secure simulate --output runs/demo.json

test: $(STAMP)
	@# compiled once here: the suite starts ~75 node processes, each of which would otherwise compile the package
	@# again where PYTHONDONTWRITEBYTECODE is set (0.6 s of CPU a start)
	$(PY) -m compileall -q fedgl_secure
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n auto --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check fedgl_secure tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) runs .pytest_cache
