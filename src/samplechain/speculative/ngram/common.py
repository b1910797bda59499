"""What every n-gram drafter shares: parameter checks against llama.cpp's ranges, token arrays and the
vectorised n-gram search (kept apart so the drafter modules need nothing from one another)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MASK32 = 0xFFFFFFFF  # uint32_t wrap-around of llama.cpp's hash arithmetic
MASK64 = 0xFFFFFFFFFFFFFFFF  # uint64_t wrap-around


def token_array(tokens: Sequence[int]) -> np.ndarray:
    """The tokens as int64 (no copy for an int64 array)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype(np.int64, copy=False)
    return np.fromiter(tokens, dtype=np.int64, count=len(tokens))


def match_positions(h: np.ndarray, key: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Ascending positions j in [lo, hi] with ``h[j : j + len(key)] == key`` (callers keep hi + len(key) <= len(h))."""
    if hi < lo:
        return np.zeros(0, dtype=np.int64)
    cand = np.flatnonzero(h[lo : hi + 1] == key[0]) + lo
    for k in range(1, len(key)):
        if not cand.size:
            break
        cand = cand[h[cand + k] == key[k]]
    return cand
