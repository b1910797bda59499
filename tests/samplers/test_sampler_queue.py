"""llama.cpp's test_sampler_queue (tests/test-sampling.cpp): top-k / top-p / min-p in every order, then dist(0)."""

import math

import numpy as np
import pytest

from samplechain import Candidates, Dist, MinP, TopK, TopP

N_VOCAB = 10000


def _check(seq, top_k, top_p, min_p):
    with np.errstate(divide="ignore"):
        logits = np.log(np.arange(N_VOCAB, dtype=np.float32))
    c = Candidates.from_logits(logits)
    min_id = 0
    size = N_VOCAB
    for ch in seq:
        if ch == "k":
            TopK(top_k).apply(c)
        elif ch == "p":
            TopP(top_p, 1).apply(c)
        else:
            MinP(min_p, 1).apply(c)
        Dist(0).apply(c)
        ids = c.ids
        if ch == "k":
            expected = min(size, top_k)
            min_id = max(min_id, N_VOCAB - top_k)
            assert len(c) == expected
            assert ids[0] == N_VOCAB - 1 and ids[-1] == min_id
        elif ch == "p":
            total = N_VOCAB * (N_VOCAB - 1) // 2 - min_id * (min_id - 1) // 2
            target = math.ceil(float(np.float32(top_p) * np.float32(total)))
            acc, expected, last = 0, 0, N_VOCAB
            for i in range(N_VOCAB - 1, min_id - 1, -1):
                acc += i
                expected += 1
                last = i
                if acc >= target:
                    break
            if last == 1:
                expected += 1
                last = 0
            min_id = last
            assert len(c) == expected
            if c.sorted:
                assert ids[0] == N_VOCAB - 1 and ids[-1] == min_id
        else:
            # token 0 has p = 0 (logit -inf) and never reaches the min-p threshold, hence the N_VOCAB - 1 cap
            expected = min(max(math.ceil(float(np.float32(1 - min_p) * N_VOCAB)), 1), size, N_VOCAB - 1)
            min_id = min(max(math.floor(float(np.float32(min_p) * N_VOCAB)), 1, N_VOCAB - expected), N_VOCAB - 1)
            assert len(c) == expected
            if c.sorted:
                assert ids[0] == N_VOCAB - 1 and ids[-1] == min_id
            else:
                assert set(ids.tolist()) == set(range(N_VOCAB - expected, N_VOCAB))
        size = len(c)


CASES = [
    ("k", 10000, 1.0, 1.0), ("k", 1, 1.0, 1.0), ("p", 10000, 1.0, 1.0), ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0), ("m", 10000, 1.0, 1e-12), ("k", 100, 1.0, 1.0), ("p", 10000, 0.0003, 1.0),
    ("p", 10000, 0.8, 1.0), ("m", 10000, 1.0, 9997.9 / 9999.0), ("m", 10000, 1.0, 0.1),
] + [(s, 100, 0.8, 0.1) for s in ("kp", "km", "pk", "pm", "mk", "mp", "kpm", "kmp", "pkm", "pmk", "mkp", "mpk")] + [
    ("mp", 100, 0.8, 9997.9 / 9999.0),
]


@pytest.mark.parametrize("seq, top_k, top_p, min_p", CASES)
def test_sampler_queue(seq, top_k, top_p, min_p):
    _check(seq, top_k, top_p, min_p)
