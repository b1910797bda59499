"""What every n-gram drafter shares: parameter checks against llama.cpp's ranges, token arrays and the
vectorised n-gram search (kept apart so the drafter modules need nothing from one another)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def _check_int(name: str, value: object, lo: int, hi: int, flag: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        where = f" (llama.cpp's {flag} range)" if flag else ""
        raise ValueError(f"{name} must be in {lo}..{hi}{where}, got {v}")
    return v


def _as_array(tokens: Sequence[int]) -> np.ndarray:
    """The tokens as int64 (no copy for an int64 array)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype(np.int64, copy=False)
    return np.fromiter(tokens, dtype=np.int64, count=len(tokens))


def _matches(h: np.ndarray, key: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Ascending positions j in [lo, hi] with ``h[j : j + len(key)] == key`` (callers keep hi + len(key) <= len(h))."""
    if hi < lo:
        return np.zeros(0, dtype=np.int64)
    cand = np.flatnonzero(h[lo : hi + 1] == key[0]) + lo
    for k in range(1, len(key)):
        if not cand.size:
            break
        cand = cand[h[cand + k] == key[k]]
    return cand
