"""Shared exact operations over candidates: llama.cpp's softmax helper, top-k selection."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import expf, seq_sum_f32
from samplechain.candidates import Candidates

# Full sorts below this size; above it, selection by a block-maximum threshold (one pass over the logits).
SMALL_SORT = 1024


def softmax(c: Candidates, do_sort: bool) -> np.ndarray:
    """llama.cpp's softmax helper: optional full sort, binary32 exp, left-to-right binary32 sum.

    Writes and returns ``c.probs``. Empty candidates are the caller's concern (callers return early).
    """
    if do_sort:
        c.sort()
    x = c.logits
    p = softmax_values(x, x[0] if c.sorted else c.max_logit)
    c.set_probs(p)
    return p


def softmax_values(x: np.ndarray, m: np.float32) -> np.ndarray:
    """The softmax helper's arithmetic on logits ``x`` with maximum ``m``: ``expf(x - m)`` over its binary32
    left-to-right sum."""
    # exact expf everywhere: these probabilities feed running sums compared against thresholds
    with np.errstate(invalid="ignore"):  # an infinite logit gives NaN, as llama.cpp's expf(inf - inf)
        e = expf(np.subtract(x, m))
        return np.true_divide(e, seq_sum_f32(e))


def indices_at_least(c: Candidates, thr: np.float32) -> np.ndarray:
    """Ascending positions of the logits ``>= thr``; with column maxima, only columns reaching thr are read."""
    x = c.logits
    col_max = c.column_max
    if col_max is None:
        return (x >= thr).nonzero()[0]
    hit_cols = (col_max >= thr).nonzero()[0]
    if len(hit_cols) * 4 > len(col_max):
        return (x >= thr).nonzero()[0]
    return _gather_columns(x, col_max, hit_cols, thr)[0]


def _gather_columns(
    x: np.ndarray, col_max: np.ndarray, hit_cols: np.ndarray, thr: np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Ascending positions and their values of the entries ``>= thr`` in the given (ascending) columns of the
    (rows, cols) block view, plus those in the tail past the grid."""
    n = len(x)
    cols = len(col_max)
    grid = n - n % cols  # rows * cols: the tail past the grid is shorter than a row (rows <= 64 < cols)
    block = (x if grid == n else x[:grid]).reshape(-1, cols).take(hit_cols, axis=1)  # [rows, len(hit_cols)]
    flat = (block >= thr).ravel().nonzero()[0]  # row-major order: ascending positions
    starts = _ROW_STARTS.get((grid, cols))
    if starts is None:
        starts = _row_starts(grid, cols)
    positions = np.add(starts, hit_cols, dtype=np.int32, casting="unsafe").take(flat)  # ids are int32
    values = block.take(flat)
    if grid < n:
        tail = (x[grid:] >= thr).nonzero()[0]
        if len(tail):
            positions = np.concatenate((positions, grid + tail))
            values = np.concatenate((values, x[grid + tail]))
    return positions, values


_ROW_STARTS: dict[tuple[int, int], np.ndarray] = {}


def _row_starts(grid: int, cols: int) -> np.ndarray:
    """``[[0], [cols], [2 * cols], ...]``: the position of each row's first entry in the block view."""
    if len(_ROW_STARTS) > 16:
        _ROW_STARTS.clear()
    starts = _ROW_STARTS[grid, cols] = np.arange(0, grid, cols, dtype=np.int32)[:, None]
    return starts


def top_k_order(c: Candidates, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the ``k`` largest logits, descending, ties by lower position (``0 < k <= len(c)``), and
    their logits.

    Large inputs take one pass: the k-th largest of the column maxima of a (rows, cols) view is a value that
    at least k entries reach, so only entries at or above it need sorting.
    """
    x = c.logits
    n = len(x)
    if n <= SMALL_SORT or k * 16 > n:
        order = np.negative(x).argsort(kind="stable")
        if k < n:
            order = order[:k]
        return order, x[order]
    col_max = c.column_max
    if col_max is not None and k * 16 <= len(col_max):
        kth = len(col_max) - k
        part = col_max.copy()  # np.partition without its Python wrapper
        part.partition(kth)
        thr = part[kth]
        cand, vals = _gather_columns(x, col_max, (col_max >= thr).nonzero()[0], thr)
    else:
        rows = max(2, n // (16 * k))
        cols = n // rows
        block_max = np.maximum.reduce(x[: rows * cols].reshape(rows, cols), axis=0)
        thr = np.partition(block_max, cols - k)[cols - k]
        cand = (x >= thr).nonzero()[0]
        vals = x[cand]
    # cand ascending: a stable sort on the values orders by (-logit, position)
    order = np.negative(vals).argsort(kind="stable")
    if len(order) > k:
        order = order[:k]
    return cand[order], vals[order]


def apply_top_k(c: Candidates, k: int) -> None:
    """llama.cpp's top-k (also used by mirostat): keep the k largest logits, sorted descending."""
    n = len(c)
    k = min(k, n)
    if c.sorted:
        c.truncate(k)
    else:
        positions, logits = top_k_order(c, k)
        c.take_gathered(positions, logits, sorted=True)
