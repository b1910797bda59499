"""Shared exact operations over candidates: parameter checks, llama.cpp's softmax helper, top-k selection."""

from __future__ import annotations

import math

import numpy as np

from samplechain._numeric import expf, seq_sum_f32
from samplechain.candidates import BLOCK_ROWS, Candidates

# Full sorts below this size; above it, selection by a block-maximum threshold (one pass over the logits).
_SMALL = 1024


def check_number(name: str, value: object, *, finite: bool = True) -> float:
    """A real number (not bool); NaN always rejected, infinities rejected when ``finite``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    if finite and math.isinf(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def softmax(c: Candidates, do_sort: bool) -> np.ndarray:
    """llama.cpp's softmax helper: optional full sort, binary32 exp, left-to-right binary32 sum.

    Writes and returns ``c.probs``. Empty candidates are the caller's concern (callers return early).
    """
    if do_sort:
        c.sort()
    x = c.logits
    # exact expf everywhere: these probabilities feed running sums compared against thresholds
    e = expf(np.subtract(x, x[0] if c.sorted else c.max_logit))
    p = np.true_divide(e, seq_sum_f32(e))
    c.set_probs(p)
    return p


def indices_at_least(c: Candidates, thr: np.float32) -> np.ndarray:
    """Ascending positions of the logits ``>= thr``; with column maxima, only columns reaching thr are read."""
    x = c.logits
    col_max = c.column_max
    if col_max is None:
        return (x >= thr).nonzero()[0]
    hit_cols = (col_max >= thr).nonzero()[0]
    if len(hit_cols) * 4 > len(col_max):
        return (x >= thr).nonzero()[0]
    return np.sort(_gather_columns(x, col_max, hit_cols, thr)[0])


def _gather_columns(
    x: np.ndarray, col_max: np.ndarray, hit_cols: np.ndarray, thr: np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Positions (unordered) and values of the entries ``>= thr`` in the given columns of the
    (BLOCK_ROWS, cols) view, plus those in the tail past the grid."""
    cols = len(col_max)
    grid = BLOCK_ROWS * cols
    block = x[:grid].reshape(BLOCK_ROWS, cols).T[hit_cols]  # [len(hit_cols), BLOCK_ROWS]
    flat = (block >= thr).ravel().nonzero()[0]
    q, row = np.divmod(flat, BLOCK_ROWS)
    positions = row * cols + hit_cols[q]
    values = block.ravel()[flat]
    if grid < len(x):
        tail = (x[grid:] >= thr).nonzero()[0]
        if len(tail):
            positions = np.concatenate((positions, grid + tail))
            values = np.concatenate((values, x[grid + tail]))
    return positions, values


def top_k_order(c: Candidates, k: int) -> np.ndarray:
    """Positions of the ``k`` largest logits, descending, ties by lower position (``0 < k <= len(c)``).

    Large inputs take one pass: the k-th largest of the column maxima of a (rows, cols) view is a value that
    at least k entries reach, so only entries at or above it need sorting.
    """
    x = c.logits
    n = len(x)
    if n <= _SMALL or k * 16 > n:
        order = np.negative(x).argsort(kind="stable")
        return order[:k] if k < n else order
    col_max = c.column_max
    if col_max is not None and k * 16 <= len(col_max):
        thr = np.partition(col_max, len(col_max) - k)[len(col_max) - k]
        hit_cols = (col_max >= thr).nonzero()[0]
        cand, vals = _gather_columns(x, col_max, hit_cols, thr)
    else:
        rows = max(2, n // (16 * k))
        cols = n // rows
        block_max = np.maximum.reduce(x[: rows * cols].reshape(rows, cols), axis=0)
        thr = np.partition(block_max, cols - k)[cols - k]
        cand = (x >= thr).nonzero()[0]
        vals = x[cand]
    # sort by (-logit, position): positions first, then a stable sort on the values
    by_pos = cand.argsort()
    cand, vals = cand[by_pos], vals[by_pos]
    order = np.negative(vals).argsort(kind="stable")[:k]
    return cand[order]


def apply_top_k(c: Candidates, k: int) -> None:
    """llama.cpp's top-k (also used by mirostat): keep the k largest logits, sorted descending."""
    n = len(c)
    k = min(k, n)
    if c.sorted:
        c.truncate(k)
    else:
        c.take(top_k_order(c, k), sorted=True)
