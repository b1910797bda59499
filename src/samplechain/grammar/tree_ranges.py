"""Index arithmetic over the vocabulary's prefix tree (``tokens.TokenTrie``), vectorised with NumPy: a tree node owns
the contiguous range ``[lo, hi)`` of token positions, so the walk behind token masks (``mask_walk.py``) reads and
joins sets of tokens as sorted ranges of positions."""

from __future__ import annotations

import numpy as np


def ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[lo, hi)``, concatenated in order (empty ranges contribute nothing)."""
    if len(lo) == 1:
        return np.arange(lo[0], hi[0])
    n = hi - lo
    keep = n > 0
    if not keep.all():
        lo, n = lo[keep], n[keep]
    if not len(n):
        return lo
    ends = np.cumsum(n)
    if ends[-1] == len(n):
        return lo
    return np.arange(ends[-1]) + np.repeat(lo - (ends - n), n)


def cover(lo: np.ndarray, hi: np.ndarray, size: int) -> np.ndarray:
    """A bool array of ``size``, True on the sorted disjoint ranges ``[lo, hi)``."""
    edges = np.empty(2 * len(lo) + 2, dtype=np.int64)
    edges[0], edges[-1] = 0, size
    edges[1:-1:2], edges[2:-1:2] = lo, hi
    values = np.zeros(len(edges) - 1, dtype=bool)
    values[1::2] = True
    return np.repeat(values, np.diff(edges))


def merged(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint ranges with the touching ones joined."""
    if len(lo) < 2:
        return lo, hi
    gap = lo[1:] != hi[:-1]
    return lo[np.concatenate([[True], gap])], hi[np.concatenate([gap, [True]])]


def outermost(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Of tree nodes sorted by (first position, depth), those below no other one of them (tree nodes' position
    ranges nest or are disjoint, so a node is below an earlier one exactly when it starts before that one ends)."""
    keep = np.ones(len(lo), dtype=bool)
    if len(lo) > 1:
        keep[1:] = lo[1:] >= np.maximum.accumulate(hi)[:-1]
    return keep


def unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (``np.unique`` without its overhead for small arrays)."""
    if len(values) < 2:
        return values
    values = np.sort(values)
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]
