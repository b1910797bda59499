"""Realistic logits for benchmarks: a peaked head and a long tail, as a language model's output looks."""

from __future__ import annotations

import numpy as np


def realistic_logits(n_vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A bulk around 0 (std 2.5), a few dozen plausible tokens 6-14 above it and one to three clear leaders."""
    x = rng.normal(0.0, 2.5, n_vocab).astype(np.float32)
    head = rng.choice(n_vocab, 40, replace=False)
    x[head] += rng.uniform(6.0, 14.0, 40).astype(np.float32)
    top = head[: rng.integers(1, 4)]
    x[top] += rng.uniform(2.0, 5.0, len(top)).astype(np.float32)
    return x
