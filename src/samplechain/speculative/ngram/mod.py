"""ngram-mod (common/ngram-mod.cpp): one hash table of n-gram followers shared by every sequence, and the
drafter that rolls a window through it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from samplechain.speculative.ngram.common import MASK64, token_array
from samplechain.validate import check_int_range

_MOD_MULT = 6364136223846793005
_MOD_EMPTY = -1


class NgramModTable:
    """ngram-mod's hash table: ``size`` int32 entries (4·2^20 = 16 MiB by default), each the token that followed
    an n-gram hashing there (-1 = empty), shared by all sequences. ``add`` overwrites; there is no collision check.
    """

    def __init__(self, n: int = 24, size: int = 4 * 1024 * 1024) -> None:
        self.n = check_int_range("n", n, 1, 1024, "--spec-ngram-mod-n-match")
        self.size = check_int_range("size", size, 1, 1 << 40)
        self.entries = np.full(self.size, _MOD_EMPTY, dtype=np.int32)
        self.used = 0  # non-empty entries
        self._pow = pow(_MOD_MULT, self.n - 1, 1 << 64)  # weight of the oldest token, for the rolling lookup

    @property
    def occupancy(self) -> float:
        return self.used / self.size

    def reset(self) -> None:
        """Empty the table (for every sequence that shares it)."""
        self.entries.fill(_MOD_EMPTY)
        self.used = 0

    def add(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """Add the n-grams starting at ``start .. stop-1`` of ``tokens``, each mapped to the token after it, in
        order (a later n-gram overwrites an earlier one in the same entry)."""
        n = self.n
        if stop <= start:
            return
        t = token_array(tokens[start : stop + n]).astype(np.uint64)
        w = stop - start
        acc = np.zeros(w, dtype=np.uint64)
        mult = np.uint64(_MOD_MULT)
        for k in range(n):
            acc = acc * mult + t[k : k + w]
        idx = acc % np.uint64(self.size)
        follow = t[n : n + w].astype(np.int64).astype(np.int32)
        rev = idx[::-1]
        slots, last = np.unique(rev, return_index=True)  # the last write to each entry wins
        self.used += int(np.count_nonzero(self.entries[slots] == _MOD_EMPTY))
        self.entries[slots] = follow[w - 1 - last]

    def _hash(self, window: Sequence[int]) -> int:
        acc = 0
        for tok in window:
            acc = (acc * _MOD_MULT + tok) & MASK64
        return acc

    def get(self, ngram: Sequence[int]) -> int:
        """The token stored for this n-gram's entry (-1 if empty); the n-gram must have ``n`` tokens."""
        if len(ngram) != self.n:
            raise ValueError(f"the n-gram must have {self.n} tokens, got {len(ngram)}")
        return int(self.entries[self._hash([int(t) for t in ngram]) % self.size])


class NgramMod:
    """ngram-mod: the last ``n_match`` tokens (ending in ``id_last``) are looked up in the shared table, the
    result appended and the window rolled, up to ``n_max`` tokens; a miss before ``n_min`` tokens drops the
    draft, a later miss ends it."""

    name = "ngram-mod"

    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64, table: NgramModTable | None = None) -> None:
        self.n_match = check_int_range("n_match", n_match, 1, 1024, "--spec-ngram-mod-n-match")
        self.n_min = check_int_range("n_min", n_min, 0, 1024, "--spec-ngram-mod-n-min")
        self.n_max = check_int_range("n_max", n_max, 0, 1024, "--spec-ngram-mod-n-max")
        if table is None:
            table = NgramModTable(self.n_match)
        elif table.n != self.n_match:
            raise ValueError(f"the shared table hashes {table.n}-grams but n_match is {self.n_match}")
        self.table = table
        self._i_last = 0  # positions below this are in the table
        self._n_draft_last = 0
        self._n_low = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self._i_last = 0
        self._n_draft_last = 0
        n = self.table.n
        if len(prompt) < n:
            return
        self.table.add(prompt, 0, len(prompt) - n)
        self._i_last = len(prompt) - n
        if self.table.occupancy > 0.25:
            self.table.reset()

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        self._n_draft_last = 0
        table = self.table
        n = table.n
        length = len(history)
        if length < n:
            return []
        if self._i_last + 32 < length:  # index the new positions in chunks
            table.add(history, self._i_last, length - n)
            self._i_last = length - n
        window = [int(t) for t in history[length - n + 1 :]]
        window.append(int(id_last))
        acc = table._hash(window)
        entries, size, pw = table.entries, table.size, table._pow
        result: list[int] = []
        for i in range(self.n_max):
            tok = int(entries[acc % size])
            if tok == _MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            result.append(tok)
            window.append(tok)
            acc = (((acc - (window[i] & MASK64) * pw) * _MOD_MULT) + (tok & MASK64)) & MASK64
        self._n_draft_last = len(result)
        return result

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        if is_other or self._n_draft_last <= 0:
            return
        if n_accepted / self._n_draft_last < 0.25:
            self._n_low += 1
            if self._n_low >= 5:
                self.table.reset()
                self._n_low = 0
                self._i_last = 0
        else:
            self._n_low = 0
