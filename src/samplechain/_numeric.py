"""Float arithmetic as llama.cpp's C++ does it: binary32 values, glibc-like ``expf``/``logf``, sequential sums.

Sums that llama.cpp accumulates left to right in ``float`` are reproduced with ``np.cumsum`` (sequential),
never with ``np.sum`` (pairwise), because the rounding of a sequential binary32 sum depends on its order.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
F64 = np.float64
NEG_INF = F32(-np.inf)

# Above this size, exponentials far below the maximum use NumPy's fast binary32 exp: their last-bit error
# cannot change a binary32 or binary64 sum that already holds the maximum's 1.0 (see expf_rel).
_EXACT_EXP_LIMIT = 2048
_FAST_EXP_BELOW = F32(-12.0)


def expf(x: np.ndarray) -> np.ndarray:
    """glibc ``expf`` on a binary32 array: the binary64 exponential rounded once to binary32.

    Matches glibc except for about 0.01 % of inputs, where glibc itself is off by one ulp.
    """
    return np.exp(x, dtype=F64).astype(F32)


def expf_rel(d: np.ndarray) -> np.ndarray:
    """``expf(d)`` for ``d = logit - max_logit <= 0``, fast on large arrays.

    Entries with ``d < -12`` (values below 6e-6) go through NumPy's vectorised binary32 exp, which can be off
    by an ulp or two; such a value is at most 1e-6 of an ulp of a running sum that holds the maximum's 1.0,
    so sums and draws built on them are unaffected but for a one-in-millions chance.
    """
    if d.size <= _EXACT_EXP_LIMIT:
        return expf(d)
    return expf_split(d)[0]


def expf_split(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``expf_rel(d)`` for any size, plus the positions of the exact entries (``d >= -12``) and their values."""
    out = np.exp(d)
    head = (d >= _FAST_EXP_BELOW).nonzero()[0]
    exact = expf(d[head])
    out[head] = exact
    return out, head, exact


_accumulate = np.add.accumulate


def seq_sum_f32(x: np.ndarray) -> np.float32:
    """Left-to-right binary32 sum (``float s = 0; for (...) s += x[i];``)."""
    if x.size == 0:
        return F32(0.0)
    return _accumulate(x, dtype=F32)[-1]


def running_sum_f32(x: np.ndarray) -> np.ndarray:
    """Left-to-right binary32 running sums."""
    return _accumulate(x, dtype=F32)


def running_sum_f64(x: np.ndarray) -> np.ndarray:
    """Left-to-right binary64 running sums (of binary32 values, converted exactly), along the last axis."""
    # converting first is faster on small arrays; the casting loop avoids a binary64 copy of large ones
    return _accumulate(x.astype(F64), axis=-1) if x.size <= 1024 else _accumulate(x, axis=-1, dtype=F64)


def logf(x: float) -> np.float32:
    """glibc ``logf`` of a binary32 value (correctly rounded in practice)."""
    x = float(F32(x))
    if x == 0.0:
        return F32(-np.inf)
    if x < 0.0:
        return F32(np.nan)
    return F32(math.log(x))


def logf_array(x: np.ndarray) -> np.ndarray:
    """Element-wise ``logf`` of a binary32 array (``logf(0) = -inf``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x.astype(F64)).astype(F32)


def log2f(x: float) -> np.float32:
    x = float(F32(x))
    if x <= 0.0:
        return F32(-np.inf) if x == 0.0 else F32(np.nan)
    return F32(math.log2(x))


def powf(base: float, exponent: float) -> np.float32:
    """glibc ``powf`` (binary64 pow rounded to binary32); inf/nan follow C semantics."""
    try:
        with np.errstate(all="ignore"):
            return F32(np.power(F64(F32(base)), F64(F32(exponent))))
    except OverflowError:  # pragma: no cover - numpy returns inf instead of raising
        return F32(np.inf)


def f32(x: float) -> np.float32:
    """C's conversion of a double to float: out of range is +-inf, silently (numpy would warn of the overflow)."""
    with np.errstate(over="ignore"):
        return F32(x)
