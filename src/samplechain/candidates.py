"""``Candidates``: the token candidates of one sampling step, as a structure of arrays.

A fresh full-vocabulary set stores only the logits (ids are implicit, ``0..n-1``) and copies nothing.
Samplers never write into the arrays: they install new ones through :meth:`Candidates.set_logits`,
:meth:`Candidates.take` or :meth:`Candidates.replace`, so the caller's logits are never modified and every
derived value (``probs``, the maximum logit) is dropped the moment the logits it came from change.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from samplechain._numeric import F32

_IDS_CACHE = np.arange(0, dtype=np.int32)
_max_reduce = np.maximum.reduce
_new = object.__new__
_INF = np.inf
_F32_DTYPE = np.dtype(F32)  # native binary32 (another byte order is converted)

# Full-vocabulary logits of at least this size are also viewed as (rows, cols) blocks; the column maxima (one
# pass, computed with the NaN check) let top-k and min-p find their survivors without scanning all logits.
_BLOCK_MIN_SIZE = 4096


def block_rows(n: int) -> int:
    """Rows of the (rows, n // rows) block view of ``n`` logits whose column maxima ``from_logits`` keeps.

    Chosen by timing (2-core AVX-512 EPYC, top-40 from the column maxima): 32 rows below 2**17 logits (49,152:
    8.9 µs against 10.5 µs with 64 rows), 64 rows above (262,144: 27 µs against 30 µs with 32 or 128 rows).
    """
    return 32 if n < 131072 else 64


def _arange(n: int) -> np.ndarray:
    global _IDS_CACHE
    if n > len(_IDS_CACHE):
        _IDS_CACHE = np.arange(max(n, 2 * len(_IDS_CACHE)), dtype=np.int32)
        _IDS_CACHE.flags.writeable = False
    return _IDS_CACHE[:n]


class Candidates:
    """Candidate token ids with their logits, lazily derived probabilities, selection and sort flag."""

    __slots__ = ("_col_max", "_ids", "_logits", "_max", "_probs", "selected", "sorted")

    def __init__(
        self,
        ids: np.ndarray | None,
        logits: np.ndarray,
        probs: np.ndarray | None = None,
        *,
        sorted: bool = False,
        selected: int = -1,
    ) -> None:
        self.replace(ids, logits, probs, sorted=sorted)
        self.selected = selected

    @classmethod
    def from_logits(cls, logits: object) -> Candidates:
        """Candidates over the full vocabulary, ids ``0..n-1``; float32 input is used without a copy.

        Raises ``ValueError`` for empty input, a non-1-D shape, NaN or +inf.
        """
        x = logits if type(logits) is np.ndarray and logits.dtype is _F32_DTYPE else np.asarray(logits, dtype=F32)
        if x.ndim != 1:
            raise ValueError(f"logits must be a 1-D array, got shape {x.shape}")
        n = x.size
        if n == 0:
            raise ValueError("logits must not be empty")
        col_max = None
        if n >= _BLOCK_MIN_SIZE:
            rows = block_rows(n)
            cols = n // rows
            grid = rows * cols
            col_max = _max_reduce((x if grid == n else x[:grid]).reshape(rows, cols), axis=0)
            m = _max_reduce(col_max)
            if grid < n:
                m = np.maximum(m, _max_reduce(x[grid:]))  # propagates NaN, unlike max()
        else:
            m = _max_reduce(x)
        if not m < _INF:  # NaN or +inf (NaN propagates through max)
            bad = "NaN" if np.isnan(x).any() else "+inf"
            raise ValueError(f"logits must not contain {bad}")
        x = x.view()  # read-only: samplers install new arrays instead of writing
        x.setflags(write=False)
        c = _new(cls)
        c.replace(None, x, sorted=False)
        c._max = m  # what was found above is kept
        c._col_max = col_max
        c.selected = -1
        return c

    @classmethod
    def from_arrays(
        cls, ids: object, logits: object, probs: object | None = None, *, sorted: bool = False
    ) -> Candidates:
        """Candidates from explicit ids and logits (and optionally probabilities), validated."""
        ids_a = np.asarray(ids, dtype=np.int32)
        x = np.asarray(logits, dtype=F32)
        if ids_a.ndim != 1 or x.ndim != 1 or len(ids_a) != len(x):
            raise ValueError(f"ids and logits must be 1-D of equal length, got {ids_a.shape} and {x.shape}")
        if np.isnan(x).any() or np.isposinf(x).any():
            raise ValueError("logits must not contain NaN or +inf")
        p = None if probs is None else np.asarray(probs, dtype=F32)
        if p is not None and p.shape != x.shape:
            raise ValueError(f"probs must have the shape of logits, got {p.shape}")
        return cls(ids_a, x, p, sorted=sorted)

    # --- read access -------------------------------------------------------------------------------------

    @property
    def ids(self) -> np.ndarray:
        """Token ids (int32) of the current candidates."""
        return _arange(len(self._logits)) if self._ids is None else self._ids

    @property
    def logits(self) -> np.ndarray:
        """Logits (float32) of the current candidates."""
        return self._logits

    @property
    def probs(self) -> np.ndarray | None:
        """Probabilities written for the current logits by the last sampler that computed them, else None."""
        if callable(self._probs):  # computed on first read (a selector's probabilities are often unused)
            self._probs = self._probs()
        return self._probs

    @property
    def identity(self) -> bool:
        """True while the candidates are the untouched full vocabulary in id order (``ids[i] == i``)."""
        return self._ids is None

    @property
    def max_logit(self) -> np.float32:
        """The largest current logit (cached until the logits change)."""
        if self._max is None:
            self._max = _max_reduce(self._logits)
        return self._max

    @property
    def column_max(self) -> np.ndarray | None:
        """For large untouched logits: the maxima of the columns of ``logits[:rows*cols].reshape(rows, cols)``,
        ``rows = block_rows(len(logits))``."""
        return self._col_max

    @property
    def token(self) -> int:
        """The selected token id; ``ValueError`` when nothing is selected."""
        if not 0 <= self.selected < len(self._logits):
            raise ValueError("no candidate is selected")
        return int(self.ids[self.selected])

    def __len__(self) -> int:
        return len(self._logits)

    def __repr__(self) -> str:
        return f"Candidates(n={len(self)}, selected={self.selected}, sorted={self.sorted})"

    # --- writes (each installs new arrays and drops what was derived from the old ones) -------------------

    def set_logits(self, logits: np.ndarray, probs: np.ndarray | None = None) -> None:
        """New logits for the same ids; probabilities are dropped unless computed for these logits."""
        self._logits = logits
        self._probs = probs
        self._max = None
        self._col_max = None

    def set_probs(self, probs: np.ndarray | Callable[[], np.ndarray]) -> None:
        """Probabilities computed from the current logits, or a function computing them on first read."""
        self._probs = probs

    def take(self, index: np.ndarray | slice, *, sorted: bool | None = None) -> None:
        """Keep the candidates at ``index`` (an index array or a slice), in that order."""
        self._ids = self.ids[index]
        self._logits = self._logits[index]
        probs = self.probs
        if probs is not None:
            self._probs = probs[index]
        self._max = None
        self._col_max = None
        if sorted is not None:
            self.sorted = sorted

    def take_gathered(self, index: np.ndarray, logits: np.ndarray, *, sorted: bool) -> None:
        """:meth:`take` for a caller that already gathered ``logits[index]`` (passed as ``logits``)."""
        self._ids = index.astype(np.int32, copy=False) if self._ids is None else self._ids[index]
        self._logits = logits
        if self._probs is not None:
            self._probs = self.probs[index]
        self._max = None
        self._col_max = None
        self.sorted = sorted

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` candidates (order and sort flag unchanged)."""
        if n < len(self._logits):
            self._ids = _arange(n) if self._ids is None else self._ids[:n]
            self._logits = self._logits[:n]
            if self._probs is not None:
                self._probs = self.probs[:n]
            self._max = None
            self._col_max = None

    def replace(
        self, ids: np.ndarray | None, logits: np.ndarray, probs: np.ndarray | None = None, *, sorted: bool
    ) -> None:
        """Install a new candidate set (``ids`` None: the full vocabulary in id order)."""
        self._ids = ids
        self._logits = logits
        self._probs = probs
        self._max = None
        self._col_max = None
        self.sorted = sorted

    def sort(self) -> None:
        """Sort by descending logit, ties by current position (stable); sets ``sorted``."""
        if not self.sorted:
            self.take(np.argsort(-self._logits, kind="stable"), sorted=True)

    def copy(self) -> Candidates:
        c = Candidates(self._ids, self._logits, self.probs, sorted=self.sorted, selected=self.selected)
        c._max = self._max
        c._col_max = self._col_max
        return c
