# The two commands: `make run` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup test run bench lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m pytest

run: setup
	$(PY) -m samplechain.demo

bench: setup
	$(PIP) install --quiet -e '.[bench]'
	$(PY) -m benchmarks.check_llama
	$(PY) -m benchmarks.bench_chain

lint: setup
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
