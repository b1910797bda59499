"""Shared exact operations over candidates: parameter checks, llama.cpp's softmax helper, top-k selection."""

from __future__ import annotations

import math

import numpy as np

from samplechain._numeric import expf_rel, seq_sum_f32
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
    m = x[0] if c.sorted else c.max_logit
    e = expf_rel(x - m)
    p = e / seq_sum_f32(e)
    c.set_probs(p)
    return p


def indices_at_least(c: Candidates, thr: np.float32) -> np.ndarray:
    """Ascending positions of the logits ``>= thr``; with column maxima, only columns reaching thr are read."""
    x = c.logits
    col_max = c.column_max
    if col_max is None:
        return np.flatnonzero(x >= thr)
    cols = len(col_max)
    hit_cols = np.flatnonzero(col_max >= thr)
    if len(hit_cols) * 4 > cols:
        return np.flatnonzero(x >= thr)
    rows, j = np.nonzero(x[: BLOCK_ROWS * cols].reshape(BLOCK_ROWS, cols)[:, hit_cols] >= thr)
    idx = rows * cols + hit_cols[j]
    tail = BLOCK_ROWS * cols
    if tail < len(x):
        idx = np.concatenate((idx, tail + np.flatnonzero(x[tail:] >= thr)))
    return idx  # row-major order of the (row, column) grid is ascending position order


def top_k_order(c: Candidates, k: int) -> np.ndarray:
    """Positions of the ``k`` largest logits, descending, ties by lower position (``0 < k <= len(c)``).

    Large inputs take one pass: the k-th largest of the column maxima of a (rows, cols) view is a value that
    at least k entries reach, so only entries at or above it need sorting.
    """
    x = c.logits
    n = len(x)
    if n <= _SMALL or k * 16 > n:
        order = np.argsort(-x, kind="stable")
        return order[:k] if k < n else order
    col_max = c.column_max
    if col_max is None or k * 16 > len(col_max):
        rows = max(2, n // (16 * k))
        cols = n // rows
        col_max = x[: rows * cols].reshape(rows, cols).max(axis=0)
        thr = np.partition(col_max, cols - k)[cols - k]
        cand = np.flatnonzero(x >= thr)
    else:
        cols = len(col_max)
        thr = np.partition(col_max, cols - k)[cols - k]
        cand = indices_at_least(c, thr)
    if len(cand) > 4 * _SMALL:
        # Many entries tie at or just above the threshold: keep those above the k-th value, then the
        # lowest-index ones equal to it.
        v = np.partition(x[cand], len(cand) - k)[len(cand) - k]
        above = cand[x[cand] > v]
        equal = cand[x[cand] == v][: k - len(above)]
        cand = np.sort(np.concatenate((above, equal)))
    order = np.argsort(-x[cand], kind="stable")[:k]
    return cand[order]


def apply_top_k(c: Candidates, k: int) -> None:
    """llama.cpp's top-k (also used by mirostat): keep the k largest logits, sorted descending."""
    n = len(c)
    k = min(k, n)
    if c.sorted:
        c.truncate(k)
    else:
        c.take(top_k_order(c, k), sorted=True)
