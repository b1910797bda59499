"""Tokens drawn by one sampler instance applied repeatedly (llama.cpp's exact draws)."""

import numpy as np
import pytest

from samplechain import AdaptiveP, Candidates, Dist, Mirostat, MirostatV2

P4_LOGITS = np.log(np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32))
L32 = (np.float32(1.1) * ((7 * np.arange(32)) % 32).astype(np.float32) - np.float32(3)).astype(np.float32)


def run(sampler, logits, steps, accept=False):
    out = []
    for _ in range(steps):
        c = Candidates.from_logits(logits)
        sampler.apply(c)
        out.append((c.token, len(c)))
        if accept:
            sampler.accept(c.token)
    return out


@pytest.mark.parametrize("seed, expected", [
    (0, [2, 3, 3, 3, 3, 2, 1, 0, 1, 2]), (42, [3, 1, 3, 2, 2, 0, 2, 2, 1, 3]), (1234, [2, 3, 3, 3, 3, 1, 1, 3, 1, 1]),
])
def test_dist_p4(seed, expected):
    assert [t for t, _ in run(Dist(seed), P4_LOGITS, 10)] == expected


@pytest.mark.parametrize("seed, expected", [
    (0, [151, 216, 219, 216, 159, 98]), (42, [203, 46, 199, 152, 114, 25]), (1234, [127, 209, 156, 197, 220, 38]),
])
def test_dist_uniform_256(seed, expected):
    assert [t for t, _ in run(Dist(seed), np.zeros(256, dtype=np.float32), 6)] == expected


MIROSTAT_L32 = {
    "v1": (lambda: Mirostat(32, 42, 5.0, 0.1, 100),
           [(18, 7, 10.282972), (9, 7, 10.724642), (18, 8, 11.007570), (9, 8, 11.449196),
            (9, 9, 11.890807), (9, 10, 12.332414), (9, 10, 12.774020), (9, 11, 13.215625)]),
    "v2": (lambda: MirostatV2(42, 5.0, 0.1),
           [(18, 6, 10.283103), (9, 7, 10.724772), (18, 7, 11.007745), (9, 7, 11.449414),
            (9, 7, 11.891084), (9, 8, 12.332709), (9, 8, 12.774335), (9, 8, 13.215961)]),
}


@pytest.mark.parametrize("version", sorted(MIROSTAT_L32))
def test_mirostat_l32(version):
    make, expected = MIROSTAT_L32[version]
    s = make()
    for token, kept, mu in expected:  # (token, candidates kept, mu after the step)
        c = Candidates.from_logits(L32)
        s.apply(c)
        assert (c.token, len(c)) == (token, kept)
        assert s.mu == pytest.approx(mu, abs=1e-5)


def test_adaptive_p_l32():
    s = AdaptiveP(0.3, 0.9, 7)
    assert [t for t, _ in run(s, L32, 8, accept=True)] == [18, 18, 28, 18, 18, 18, 13, 18]


def test_reset_reseeds_to_the_same_stream():
    s = Dist(42)
    first = run(s, P4_LOGITS, 5)
    s.reset()
    assert run(s, P4_LOGITS, 5) == first


def test_default_seed_resolves_differently_per_sampler():
    seeds = {Dist().seed_cur for _ in range(8)}
    assert len(seeds) > 1


def test_mirostat_reset_restores_mu():
    s = Mirostat(32, 42, 5.0, 0.1)
    first = run(s, L32, 3)
    s.reset()
    assert s.mu == np.float32(10.0)
    assert run(s, L32, 3) == first


@pytest.mark.parametrize("make", [
    lambda: Dist(42), lambda: Mirostat(32, 42, 5.0, 0.1),
    lambda: MirostatV2(42, 5.0, 0.1), lambda: AdaptiveP(0.3, 0.9, 7),
])
def test_clone_is_an_exact_independent_copy(make):
    s = make()
    run(s, L32, 2, accept=True)
    c = s.clone()
    a = run(s, L32, 4, accept=True)
    b = run(c, L32, 4, accept=True)
    assert a == b
