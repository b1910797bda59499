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


# the packaged models, loaded once per test session (runtime, speculative and CLI tests share them)
@pytest.fixture(scope="session")
def smol():
    from samplechain.runtime import load_model

    return load_model()


@pytest.fixture(scope="session")
def gemma():
    from samplechain.runtime import load_model

    return load_model("gemma3-270m")


@pytest.fixture(scope="session", params=["smollm2", "gemma3-270m"])
def any_model(request, smol, gemma):
    return smol if request.param == "smollm2" else gemma
