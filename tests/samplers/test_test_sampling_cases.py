"""Every case of llama.cpp's tests/test-sampling.cpp, exact expected values."""

import numpy as np
import pytest
from tests.conftest import apply_all, expect_probs

from samplechain import (
    DRY,
    XTC,
    Candidates,
    Dist,
    DynamicTemperature,
    MinP,
    Penalties,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)

P4 = [0.1, 0.2, 0.3, 0.4]
P5 = [0.2] * 5
Q4 = [0.25] * 4


def test_dist_singleton_consumes_a_draw():
    a, b = Dist(4242), Dist(4242)
    ca, cb = Candidates.from_logits([0.0]), Candidates.from_logits([0.0, 0.0])
    a.apply(ca)
    b.apply(cb)
    assert ca.selected == 0 and ca.probs.tolist() == [1.0]
    zeros = np.zeros(256, dtype=np.float32)
    for _ in range(4):
        ca, cb = Candidates.from_logits(zeros), Candidates.from_logits(zeros)
        a.apply(ca)
        b.apply(cb)
        assert ca.selected == cb.selected


@pytest.mark.parametrize("sampler, expected", [
    (Temperature(1.0), P4),
    (Temperature(0.0), [0, 0, 0, 1]),
    (DynamicTemperature(1.0, 0.0, 1.0), P4),
    (DynamicTemperature(0.0, 0.0, 1.0), [0, 0, 0, 1]),
    (TopK(1), [1.0]),
    (TopK(3), [0.44444, 0.33333, 0.22222]),
    (TopK(4), [0.4, 0.3, 0.2, 0.1]),
    (TopK(0), P4),
    (TopP(0.0, 0), [1.0]),
    (TopP(0.7), [0.571429, 0.428571]),
    (TopP(0.8), [0.44444, 0.33333, 0.22222]),
    (TopP(1.0), P4),
    (MinP(0.0, 0), P4),
    (MinP(0.24), P4),
    (MinP(0.26), [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (MinP(0.49), [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (MinP(0.51), [0.3 / 0.7, 0.4 / 0.7]),
    (MinP(0.74), [0.3 / 0.7, 0.4 / 0.7]),
    (MinP(0.76), [1.0]),
    (MinP(1.00), [1.0]),
    (MinP(1.05), [1.0]),
    (TopNSigma(1.0), [0, 0, 0.428571, 0.571429]),
    (TopNSigma(0.0), P4),
    (TopNSigma(3.0), P4),
], ids=lambda v: repr(v) if not isinstance(v, list) else "")
def test_then_dist(sampler, expected):
    expect_probs(apply_all([sampler, Dist(0)], P4), expected)


@pytest.mark.parametrize("t, expected", [
    (0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1]),
])
def test_xtc(t, expected):
    expect_probs(apply_all([XTC(0.99, t, 0, 0)], [0.4, 0.3, 0.2, 0.1]), expected)


@pytest.mark.parametrize("probs, expected", [
    ([0.97, 0.01, 0.01, 0.01], [0.97]),
    ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2]),
])
def test_typical(probs, expected):
    expect_probs(apply_all([Typical(0.5, 0)], probs), expected)


def _penalties(history, repeat, freq, present):
    s = Penalties(len(history), repeat, freq, present)
    for t in history:
        s.accept(t)
    return s


@pytest.mark.parametrize("history, params, expected", [
    ([0], (50, 0, 0), [0, 0.25, 0.25, 0.25, 0.25]),
    ([0, 1, 2], (50, 0, 0), [0, 0, 0, 0.5, 0.5]),
    ([0, 1, 2, 0, 0], (50, 0, 0), [0, 0, 0, 0.5, 0.5]),
    ([0], (1, 5, 5), [0.000011, 0.249997, 0.249997, 0.249997, 0.249997]),
    ([0, 1, 2], (1, 5, 5), [0.000023, 0.000023, 0.000023, 0.499966, 0.499966]),
    ([0, 1, 2, 0, 0], (1, 5, 5), [0.000000, 0.000023, 0.000023, 0.499977, 0.499977]),
])
def test_penalties(history, params, expected):
    expect_probs(apply_all([_penalties(history, *params), Dist(0)], P5), expected)


def _dry(history, mult, base, allowed, last_n, breakers):
    s = DRY.from_token_breakers(mult, base, allowed, last_n, breakers)
    for t in history:
        s.accept(t)
    return s


@pytest.mark.parametrize("probs, history, params, expected", [
    (Q4, [0, 1], (1.0, 1.1, 2, 4, []), [0.25] * 4),
    (Q4, [0, 1, 2, 0, 1], (1.0, 1.1, 2, 5, []), [0.296923, 0.296923, 0.109232, 0.296923]),
    (P5, [0, 1, 3, 4, 0, 1], (1.0, 1.1, 2, 6, [[3]]), [0.2] * 5),
    (P5, [0, 1, 2, 0, 1], (2.0, 1.1, 2, 5, []), [0.241818, 0.241818, 0.032727, 0.241818, 0.241818]),
    (P5, [0, 1, 2, 3, 4, 0, 1], (1.0, 1.1, 4, 7, []), [0.2] * 5),
])
def test_dry(probs, history, params, expected):
    expect_probs(apply_all([_dry(history, *params), Dist(0)], probs), expected)
