"""ngram-map-k and ngram-map-k4v (common/ngram-map.cpp): per-sequence maps from key n-grams to their hits
and following m-grams, over a hash index of the history."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from samplechain.speculative.ngram.common import MASK32, match_positions, token_array
from samplechain.validate import check_int_range

_MAP_HASH_SIZE = 1 << 18  # COMMON_NGRAM_HASH_MAP_SIZE
_MAP_LCG = 2654435761  # near (sqrt(5) - 1) / 2 * 2^32
_MAP_MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
_MAP_MAX_VALUES = 4


class _Key:
    """One key n-gram: where it occurred, how far its value statistics go, its hits, and up to 4 values
    ``[value_idx, value_num, n_accepted]`` (value_idx 0 = free slot)."""

    __slots__ = ("key_idx", "key_num", "stat_idx", "values")

    def __init__(self, key_idx: int, m: int) -> None:
        self.key_idx = key_idx
        self.stat_idx = 0
        self.key_num = 0
        self.values = [[0, 0, m] for _ in range(_MAP_MAX_VALUES)]


def _map_hashes(h: np.ndarray, positions: np.ndarray, n: int) -> np.ndarray:
    """llama.cpp's 32-bit LCG hash of the n-grams starting at ``positions``, mod the table size."""
    acc = np.zeros(len(positions), dtype=np.uint32)
    mult = np.uint32(_MAP_LCG)
    for k in range(n):
        acc = acc * mult + h[positions + k].astype(np.uint32)
    return acc % np.uint32(_MAP_HASH_SIZE)


class NgramMapK:
    """ngram-map-k (``values=False``) and ngram-map-k4v (``values=True``): a per-sequence map from key n-grams to
    their hits and up to 4 following m-grams, with a 2^18-entry hash index of the history's n-gram positions.

    map-k drafts the ``min(M, n_accepted)`` tokens after the found occurrence whenever the key is found.
    k4v also requires ``key_num >= min_hits`` and a dominant value: with ``max`` the largest value count and
    ``others`` the sum of the rest, no draft when ``others > 0`` and ``max < 2·others``.

    Key entries and values are positions in the history, compared against the history given to each call, as in
    llama.cpp: between ``begin`` calls the history is expected to only grow (the server and the examples append
    the accepted tokens); a prompt that shrank (e.g. reasoning removed from a chat) goes through ``begin``.
    """

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, values: bool = False) -> None:
        kind = "k4v" if values else "k"
        self.size_n = check_int_range("size_n", size_n, 1, 1024, f"--spec-ngram-map-{kind}-size-n")
        self.size_m = check_int_range("size_m", size_m, 1, 1024, f"--spec-ngram-map-{kind}-size-m")
        self.min_hits = check_int_range("min_hits", min_hits, 1, 65535, f"--spec-ngram-map-{kind}-min-hits")  # uint16
        self.values = bool(values)
        self.name = "ngram-map-k4v" if values else "ngram-map-k"
        self.n_max = self.size_m
        self._keys: list[_Key] = []
        self._key_idx: np.ndarray | None = None  # the keys' positions, rebuilt when keys are added or deleted
        self._key_map = np.zeros(_MAP_HASH_SIZE, dtype=np.uint32)  # hash -> position (0 = empty)
        self._key_map_last_idx = 0
        self._size_last_begin = 0
        self._idx_last_check = 0
        self._last_draft_created = False
        self._last_key = 0
        self._last_value = 0

    def begin(self, prompt: Sequence[int]) -> None:
        n, m = self.size_n, self.size_m
        size_begin = len(prompt)
        cleanup = self._size_last_begin
        if cleanup > size_begin:  # the prompt shrank below the last begin: drop what the last N+M tokens may change
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self._idx_last_check:
            stale = self._key_map >= max(cleanup, 1)
            self._key_map[stale] = 0
            self._key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            kept: list[_Key] = []
            for key in self._keys:
                if key.key_idx >= cleanup:
                    continue
                if not self.values:
                    kept.append(key)
                    continue
                for j in range(_MAP_MAX_VALUES - 1, -1, -1):
                    v = key.values[j]
                    if v[0] != 0 and v[0] >= cleanup:  # delete: shift the later values left, clear the last
                        last = key.values[-1]
                        key.values[j:] = [*key.values[j + 1 :], [0, 0, last[2]]]
                if key.values[0][0] != 0:
                    kept.append(key)
            self._keys = kept
            self._key_idx = None
        self._idx_last_check = size_begin
        self._size_last_begin = size_begin

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        self._last_draft_created = False
        self._last_key = 0
        self._last_value = 0
        n, m = self.size_n, self.size_m
        length = len(history)
        if length < 2 * n + m:
            return []
        if self._idx_last_check > length or self._size_last_begin > length:
            raise ValueError(
                f"{self.name}: history has {length} tokens, fewer than the {self._idx_last_check} already checked; "
                "call begin() with the new prompt after the history shrinks"
            )
        self._idx_last_check = length
        h = token_array(history)
        key = np.empty(n, dtype=np.int64)
        key[: n - 1] = h[length - n + 1 :]
        key[n - 1] = id_last
        top = length - n - m - 1  # the newest start position indexed or scanned this call

        match_pos = 0
        slot = 0
        for t in key.tolist():
            slot = (slot * _MAP_LCG + t) & MASK32
        stored = int(self._key_map[slot % _MAP_HASH_SIZE])
        if stored != 0 and stored < top and np.array_equal(h[stored : stored + n], key):
            match_pos = stored

        # the not-yet-indexed positions, newest first: [last_idx+1, begin-N-M-1] then (max(begin, last_idx), top]
        ranges = []
        if self._size_last_begin > n + m + 1:
            ranges.append((self._key_map_last_idx + 1, self._size_last_begin - n - m - 1))
        ranges.append((max(self._size_last_begin, self._key_map_last_idx) + 1, top))
        if match_pos == 0:
            for lo, hi in ranges:
                found = match_positions(h, key, lo, hi)
                if found.size:
                    match_pos = int(found[-1])
                    break
        order = [np.arange(hi, lo - 1, -1, dtype=np.int64) for lo, hi in ranges if hi >= lo]
        if order:
            positions = np.concatenate(order)
            slots = _map_hashes(h, positions, n)
            slots, first = np.unique(slots, return_index=True)  # first writer wins, in the order above
            free = self._key_map[slots] == 0
            self._key_map[slots[free]] = positions[first[free]].astype(np.uint32)
        self._key_map_last_idx = max(top, self._key_map_last_idx)

        if match_pos == 0:
            return []

        # the key entry, matched by token content in the current history
        offset = len(self._keys)
        if self._keys:
            idx = self._key_idx
            if idx is None or len(idx) != len(self._keys):
                idx = np.fromiter((k.key_idx for k in self._keys), dtype=np.int64, count=len(self._keys))
                self._key_idx = idx
            cand = np.flatnonzero((idx + n <= length) & (h[np.minimum(idx, length - 1)] == key[0]))
            for k in range(1, n):
                if not cand.size:
                    break
                cand = cand[h[idx[cand] + k] == key[k]]
            if cand.size:
                offset = int(cand[0])
        if offset == len(self._keys):
            self._keys.append(_Key(match_pos, m))
        entry = self._keys[offset]
        entry.key_num = min(entry.key_num + 1, _MAP_MAX_COUNT)

        if not self.values:
            n_draft = min(m, entry.values[0][2])
            self._last_draft_created = True
            self._last_key = offset
            self._last_value = 0
            return h[match_pos + n : match_pos + n + max(n_draft, 0)].tolist()

        if entry.key_num < self.min_hits:
            return []
        # value statistics: every occurrence of the key in [stat_idx, match_pos] (stat_idx inclusive: quirk)
        for i in match_positions(h, key, entry.stat_idx, match_pos).tolist():
            begin_value = i + n
            mgram = h[begin_value : begin_value + m].tobytes()
            slot_value = -1
            for v in range(_MAP_MAX_VALUES):
                value = entry.values[v]
                if value[0] == 0:  # a free slot: a new value m-gram
                    value[0], value[1], value[2] = begin_value, 0, m
                    slot_value = v
                    break
                if h[value[0] : value[0] + m].tobytes() == mgram:
                    slot_value = v
                    break
            if slot_value >= 0:
                value = entry.values[slot_value]
                value[1] = min(value[1] + 1, _MAP_MAX_COUNT)
        entry.stat_idx = match_pos

        max_occur = 0
        slot_max = 0
        for v in range(_MAP_MAX_VALUES):
            if entry.values[v][1] > max_occur:
                max_occur = entry.values[v][1]
                slot_max = v
        others = sum(entry.values[v][1] for v in range(_MAP_MAX_VALUES) if v != slot_max)
        if others > 0 and max_occur < 2 * others:
            return []
        n_draft = min(m, entry.values[slot_max][2])
        self._last_draft_created = True
        self._last_key = offset
        self._last_value = slot_max
        return h[match_pos + n : match_pos + n + max(n_draft, 0)].tolist()

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        if is_other or not self._last_draft_created or self._last_key >= len(self._keys):
            return
        self._keys[self._last_key].values[self._last_value][2] = int(n_accepted)
