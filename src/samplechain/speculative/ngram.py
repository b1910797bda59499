"""llama.cpp's draftless n-gram drafters (spec/speculative §1, §2.6-2.9): ngram-simple, ngram-map-k,
ngram-map-k4v, ngram-mod and ngram-cache, with llama.cpp's priority order and the lookup-cache file format.

Every drafter serves one sequence and follows the small ``Drafter`` protocol the verification loop drives:
``begin(prompt)`` once after prompt processing, ``draft(history, id_last)`` each round (``history`` = the tokens
in the context, without ``id_last``), ``accept(n_accepted, is_other)`` after verification: ``is_other=False`` for
the drafter whose draft was verified, ``True`` for the others (§1.4). ``draft_round`` is llama.cpp's
``common_speculative_draft`` for one sequence: the first non-empty draft in priority order wins.

llama.cpp quirks reproduced (each is what llama.cpp does, on purpose or not):

* ngram-simple and ngram-map-k ignore ``min_hits`` (§8); ngram-simple needs ``L > N + M + 1`` tokens, never
  matches position 0 and drops a match followed by fewer than N tokens.
* ngram-map-k/k4v: the hash table keeps the *first* position written to a slot (positions are indexed newest
  first, one batch per call), so once an n-gram is indexed the drafter keeps drafting from that occurrence, not
  from newer ones; a hash collision hides an n-gram from the table, and then only the linear scans can find it.
  The scans and the index skip the positions ``size_last_begin - N - M … size_last_begin`` (the first range ends
  below them, the second starts above them), so an n-gram starting there is never found.
* ngram-map-k: after ``accept(0)`` the key's ``n_accepted`` is 0 and it drafts nothing again (the draft length
  is ``min(M, n_accepted)`` and only a non-empty draft is verified).
* ngram-map-k4v drafts the tokens after the *found* occurrence, not the winning value's own tokens (§8); value
  statistics are rescanned from ``stat_idx`` *inclusive*, so the occurrence at the previous match is counted once
  more on every call that finds it again; only 4 distinct values are kept, later ones are dropped uncounted.
* ngram-mod: one table for all sequences, no collision check (a lookup may return the follower of another
  n-gram); new positions are indexed only when more than 32 accumulated (``i_last + 32 < L``); the occupancy
  check (> 0.25 → clear) runs only in ``begin``; 5 consecutive rounds with acceptance < 0.25 clear the table for
  every sequence but reset ``i_last`` only of the sequence that saw them (the comment in llama.cpp says 0.5);
  ``begin`` does not reset the low-acceptance streak.
* ngram-cache: ``n_draft`` is 8; the context cache is updated with the new tokens as an isolated sequence, so
  n-grams spanning the old/new boundary are never added (§8); ``begin`` is a no-op, so the context cache of a
  previous prompt stays and is only extended once a history is longer than every history seen before. Ties
  between followers are broken by the iteration order of libstdc++'s ``std::unordered_map`` (GCC's prime
  rehash policy), which is emulated exactly; saved files list records in that order too.

llama.cpp bugs fixed here:

* ngram-cache reads before the start of the token vector when history + draft hold fewer than 4 tokens
  (undefined behaviour); n-gram sizes longer than the available tokens are skipped instead.
* ngram-cache multiplies counts in ``int32`` (``count · 100 · static_count``, and the sums), which overflows for
  large static caches; Python integers are exact.
* llama.cpp aborts the process on a malformed cache file (``GGML_ASSERT``) or when a map drafter sees a history
  shorter than the one it last checked (``GGML_ABORT``); here both raise ``ValueError`` with the reason. Unlike
  llama.cpp, a trailing fragment of fewer than 16 bytes is an error too, not silently ignored.
* ngram-mod's occupancy counts non-empty table entries, as the spec says (some llama.cpp revisions counted
  overwrites of occupied entries instead).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence

import numpy as np

from samplechain.runtime.speculation import Drafter

__all__ = [
    "DRAFT_MODEL_TYPES",
    "NGRAM_TYPES",
    "SPEC_TYPES",
    "Drafter",
    "NgramCache",
    "NgramCacheTable",
    "NgramMapK",
    "NgramMod",
    "NgramModTable",
    "NgramSimple",
    "draft_round",
    "make_drafters",
]

# §1.1/§1.2: every --spec-type name; the implementations in llama.cpp's priority order (first = tried first)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
SPEC_TYPES = ("none", *NGRAM_TYPES, *DRAFT_MODEL_TYPES)

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


# ---------------------------------------------------------------------------------------------------------------
# ngram-simple (§2.6)


class NgramSimple:
    """ngram-simple: the N tokens ending in ``id_last`` are looked up in the history, most recent occurrence
    first (position 0 never), and up to M tokens that followed it are the draft. Stateless."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        self.size_n = _check_int("size_n", size_n, 1, 1024, "--spec-ngram-simple-size-n")
        self.size_m = _check_int("size_m", size_m, 1, 1024, "--spec-ngram-simple-size-m")
        self.n_max = self.size_m

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        n, m = self.size_n, self.size_m
        length = len(history)
        if length <= n + m + 1:
            return []
        h = _as_array(history)
        key = np.empty(n, dtype=np.int64)
        key[: n - 1] = h[length - n + 1 :]
        key[n - 1] = id_last
        found = _matches(h, key, 1, length - n - 1)  # start positions L-N-1 down to 1
        if not found.size:
            return []
        j = int(found[-1])
        c = min(m, length - (j + n))
        if c < n:
            return []
        return h[j + n : j + n + c].tolist()

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# ngram-map-k / ngram-map-k4v (§2.7)

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
        self.size_n = _check_int("size_n", size_n, 1, 1024, f"--spec-ngram-map-{kind}-size-n")
        self.size_m = _check_int("size_m", size_m, 1, 1024, f"--spec-ngram-map-{kind}-size-m")
        self.min_hits = _check_int("min_hits", min_hits, 1, 65535, f"--spec-ngram-map-{kind}-min-hits")  # uint16
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
        h = _as_array(history)
        key = np.empty(n, dtype=np.int64)
        key[: n - 1] = h[length - n + 1 :]
        key[n - 1] = id_last
        top = length - n - m - 1  # the newest start position indexed or scanned this call

        match_pos = 0
        slot = 0
        for t in key.tolist():
            slot = (slot * _MAP_LCG + t) & _M32
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
                found = _matches(h, key, lo, hi)
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
        for i in _matches(h, key, entry.stat_idx, match_pos).tolist():
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


# ---------------------------------------------------------------------------------------------------------------
# ngram-mod (§2.8)

_MOD_MULT = 6364136223846793005
_MOD_EMPTY = -1


class NgramModTable:
    """ngram-mod's hash table: ``size`` int32 entries (4·2^20 = 16 MiB by default), each the token that followed
    an n-gram hashing there (-1 = empty), shared by all sequences. ``add`` overwrites; there is no collision check.
    """

    def __init__(self, n: int = 24, size: int = 4 * 1024 * 1024) -> None:
        self.n = _check_int("n", n, 1, 1024, "--spec-ngram-mod-n-match")
        self.size = _check_int("size", size, 1, 1 << 40)
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
        t = _as_array(tokens[start : stop + n]).astype(np.uint64)
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
            acc = (acc * _MOD_MULT + tok) & _M64
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
        self.n_match = _check_int("n_match", n_match, 1, 1024, "--spec-ngram-mod-n-match")
        self.n_min = _check_int("n_min", n_min, 0, 1024, "--spec-ngram-mod-n-min")
        self.n_max = _check_int("n_max", n_max, 0, 1024, "--spec-ngram-mod-n-max")
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
            acc = (((acc - (window[i] & _M64) * pw) * _MOD_MULT) + (tok & _M64)) & _M64
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


# ---------------------------------------------------------------------------------------------------------------
# ngram-cache (§2.9)

_NGRAM_MIN = 1
_NGRAM_MAX = 4
_NGRAM_STATIC = 2
_NULL = -1  # LLAMA_TOKEN_NULL: pads n-grams to 4 tokens
_MIN_SAMPLE_LAX = (2, 2, 1, 1)
_MIN_PERCENT_LAX = (66, 50, 50, 50)
_MIN_SAMPLE_STRICT = (4, 3, 2, 2)
_MIN_PERCENT_STRICT = (75, 66, 66, 66)
_TOKEN_HASH = 11400714819323198485  # common_token_hash_function (Fibonacci hashing)

# bucket counts of a libstdc++ unordered_map as it grows from empty (max load factor 1): it holds up to
# GROWTH[k] elements in GROWTH[k] buckets, and rehashes into GROWTH[k+1] when one more is inserted
_STL_GROWTH = (
    13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061, 712697, 1447153,
    2938679, 5967347, 12117689, 24607243, 49969847, 101473717, 206062531, 418451333, 849749479, 1725587117,
    3504151727,
)  # fmt: skip

# an n-gram key: its 4 tokens (padded with -1) as native int32 bytes, as llama.cpp's common_ngram lies in memory
# and in files (bytes are not tracked by the garbage collector and hash fast)
_KEY = struct.Struct("=4i")
_PADS = tuple((_NULL,) * (_NGRAM_MAX - n) for n in range(_NGRAM_MAX + 1))


def _stl_order(hashes: Sequence[int]) -> list[int]:
    """Iteration order of a libstdc++ ``std::unordered_map`` (unique keys, never erased) whose keys were inserted
    in this order with these ``size_t`` hash codes, as indices into ``hashes``.

    libstdc++ keeps one singly linked list: a key whose bucket is empty goes to the front of the list, otherwise to
    the front of its bucket's run; a rehash relinks the old order into the new buckets by the same rule.
    """
    n = len(hashes)
    if n > 512:
        return _stl_order_np(np.asarray(hashes, dtype=np.uint64))
    order: list[int] = []
    done = 0
    for nb in _STL_GROWTH:
        upto = min(n, nb)
        runs: dict[int, list[int]] = {}
        for k in [*order, *range(done, upto)]:
            b = hashes[k] % nb
            run = runs.get(b)
            if run is None:
                runs[b] = [k]
            else:
                run.append(k)
        order = [k for run in reversed(runs.values()) for k in reversed(run)]
        done = upto
        if done == n:
            break
    return order


def _stl_order_np(hashes: np.ndarray) -> list[int]:
    n = len(hashes)
    order = np.zeros(0, dtype=np.int64)
    done = 0
    for nb in _STL_GROWTH:
        upto = min(n, nb)
        seq = np.concatenate([order, np.arange(done, upto, dtype=np.int64)])
        buckets = hashes[seq] % np.uint64(nb)
        _, first, inverse = np.unique(buckets, return_index=True, return_inverse=True)
        pos = np.arange(len(seq))
        order = seq[np.lexsort((-pos, -first[inverse.ravel()]))]  # newest bucket run first, newest key first
        done = upto
        if done == n:
            break
    return order.tolist()


def _key(tokens: Sequence[int]) -> bytes:
    if not 1 <= len(tokens) <= _NGRAM_MAX:
        raise ValueError(f"an n-gram has 1..{_NGRAM_MAX} tokens, got {len(tokens)}")
    return _KEY.pack(*tokens, *_PADS[len(tokens)])


def _int32_tokens(tokens: Sequence[int]) -> list[int]:
    out = [int(t) for t in tokens]
    if out and not (-(1 << 31) <= min(out) and max(out) < 1 << 31):
        raise ValueError("token ids must fit in int32 (llama_token)")
    return out


class NgramCacheTable:
    """llama.cpp's ``common_ngram_cache``: n-gram (1..4 tokens, padded with -1) -> histogram {next token: count}.

    Histograms iterate (and files list records) in the order llama.cpp's libstdc++ ``std::unordered_map`` would,
    since that order breaks ties when drafting.
    """

    def __init__(self) -> None:
        self._parts: dict[bytes, dict[int, int]] = {}  # insertion order = llama.cpp's insertion order
        self._orders: dict[bytes, list[int]] = {}  # cached iteration orders, dropped when a token is inserted

    def __len__(self) -> int:
        return len(self._parts)

    def copy(self) -> NgramCacheTable:
        out = NgramCacheTable()
        out._parts = {k: dict(v) for k, v in self._parts.items()}  # a copy keeps the source's order
        return out

    def _ordered(self, key: bytes, part: dict[int, int]) -> list[int]:
        order = self._orders.get(key)
        if order is None:
            tokens = list(part)
            order = [tokens[i] for i in _stl_order([t & _M64 for t in tokens])]  # std::hash<int>: the value
            self._orders[key] = order
        return order

    def histogram(self, ngram: Sequence[int]) -> dict[int, int]:
        """The followers of ``ngram`` (1..4 tokens) and their counts, in llama.cpp's iteration order."""
        key = _key(_int32_tokens(ngram))
        part = self._parts.get(key)
        if part is None:
            return {}
        return {t: part[t] for t in self._ordered(key, part)}

    def items(self) -> list[tuple[tuple[int, ...], dict[int, int]]]:
        """(n-gram padded to 4 tokens with -1, histogram) pairs in llama.cpp's order (the order ``save`` writes)."""
        keys = list(self._parts)
        out = []
        for i in self._outer_order(keys):
            key = keys[i]
            part = self._parts[key]
            out.append((_KEY.unpack(key), {t: part[t] for t in self._ordered(key, part)}))
        return out

    @staticmethod
    def _outer_order(keys: list[bytes]) -> list[int]:
        if not keys:
            return []
        grams = np.frombuffer(b"".join(keys), dtype=np.int32).reshape(-1, _NGRAM_MAX)
        grams = grams.astype(np.int64).astype(np.uint64) * np.uint64(_TOKEN_HASH)
        hashes = grams[:, 0] ^ grams[:, 1] ^ grams[:, 2] ^ grams[:, 3]  # common_ngram_hash_function
        return _stl_order_np(hashes) if len(keys) > 512 else _stl_order(hashes.tolist())

    def update(self, tokens: Sequence[int], ngram_min: int = _NGRAM_MIN, ngram_max: int = _NGRAM_MAX,
               n_new: int | None = None) -> None:
        """``common_ngram_cache_update``: for each size n in ngram_min..ngram_max and each of the last ``n_new``
        positions i >= n, count ``tokens[i]`` after ``tokens[i-n:i]``."""
        _check_int("ngram_min", ngram_min, 1, _NGRAM_MAX)
        _check_int("ngram_max", ngram_max, ngram_min, _NGRAM_MAX)
        toks = _int32_tokens(tokens)
        length = len(toks)
        n_new = length if n_new is None else n_new
        parts, orders = self._parts, self._orders
        arr = np.array(toks, dtype=np.int32) if length > 256 else None
        for n in range(ngram_min, ngram_max + 1):
            start = max(length - n_new, n)
            if start >= length:
                continue
            if arr is None:
                pad = _PADS[n]
                keys = [_KEY.pack(*toks[i - n : i], *pad) for i in range(start, length)]
            else:
                grams = np.full((length - start, _NGRAM_MAX), _NULL, dtype=np.int32)
                for k in range(n):
                    grams[:, k] = arr[start - n + k : length - n + k]
                buf = grams.tobytes()
                keys = [buf[j : j + 16] for j in range(0, len(buf), 16)]
            for key, token in zip(keys, toks[start:length], strict=True):
                part = parts.get(key)
                if part is None:
                    parts[key] = {token: 1}
                    continue
                c = part.get(token)
                if c is None:
                    part[token] = 1
                    orders.pop(key, None)
                else:
                    part[token] = c + 1

    def merge(self, other: NgramCacheTable) -> None:
        """``common_ngram_cache_merge``: add ``other``'s counts, in ``other``'s order (llama-lookup-merge)."""
        keys = list(other._parts)
        for i in other._outer_order(keys):
            key = keys[i]
            src = other._parts[key]
            part = self._parts.get(key)
            if part is None:
                self._parts[key] = dict(src)
                continue
            for token in other._ordered(key, src):
                c = part.get(token)
                if c is None:
                    part[token] = src[token]
                    self._orders.pop(key, None)
                else:
                    part[token] = c + src[token]

    @classmethod
    def from_tokens(cls, token_lists: Iterable[Sequence[int]], ngram_size: int = _NGRAM_STATIC) -> NgramCacheTable:
        """A static cache as ``llama-lookup-create`` builds it: the ``ngram_size``-grams (2 by default) of each
        token list, counted into one table."""
        _check_int("ngram_size", ngram_size, 1, _NGRAM_MAX)
        table = cls()
        for tokens in token_lists:
            table.update(tokens, ngram_size, ngram_size)
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NgramCacheTable:
        """Read a lookup-cache file (native-endian records: 4 int32 n-gram, int32 n > 0, then n pairs of int32
        token and int32 count > 0). A missing file raises ``FileNotFoundError``, a malformed one ``ValueError``."""
        with open(path, "rb") as f:
            data = f.read()
        name = os.fspath(path)
        if len(data) % 4:
            raise ValueError(f"{name}: {len(data)} bytes is not a whole number of int32 fields (truncated record)")
        words = np.frombuffer(data, dtype=np.int32)
        total = len(words)
        table = cls()
        parts = table._parts
        pos = 0
        record = 0
        while pos < total:
            if pos + 5 > total:
                raise ValueError(f"{name}: record {record} at byte {4 * pos} is truncated (no follower count)")
            n = int(words[pos + 4])
            if n <= 0:
                raise ValueError(f"{name}: record {record} at byte {4 * pos} has {n} followers; must be > 0")
            end = pos + 5 + 2 * n
            if end > total:
                raise ValueError(f"{name}: record {record} at byte {4 * pos} is truncated "
                                 f"({n} followers need {8 * n} bytes, {4 * (total - pos - 5)} left)")
            flat = words[pos + 5 : end].tolist()
            part: dict[int, int] = {}
            for j in range(0, 2 * n, 2):
                if flat[j + 1] <= 0:
                    raise ValueError(f"{name}: record {record} at byte {4 * pos}: follower {flat[j]} has count "
                                     f"{flat[j + 1]}; counts must be > 0")
                part.setdefault(flat[j], flat[j + 1])  # emplace: the first of duplicate followers stays
            parts.setdefault(data[4 * pos : 4 * pos + 16], part)  # likewise the first of duplicate records
            pos = end
            record += 1
        return table

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the table in llama.cpp's lookup-cache format, records in llama.cpp's order."""
        out: list[int] = []
        for ngram, hist in self.items():
            out.extend(ngram)
            out.append(len(hist))
            for token, count in hist.items():
                out.append(token)
                out.append(count)
        np.array(out, dtype=np.int32).tofile(os.fspath(path))


def _as_table(value: NgramCacheTable | str | os.PathLike[str] | None, what: str) -> NgramCacheTable:
    if value is None:
        return NgramCacheTable()
    if isinstance(value, NgramCacheTable):
        return value
    if isinstance(value, (str, os.PathLike)):
        return NgramCacheTable.load(value)
    raise ValueError(f"{what} must be an NgramCacheTable or a file path, got {type(value).__name__}")


def _pick(part: dict[int, int], order: list[int], static: dict[int, int], min_sample: int, min_percent: int) -> int:
    """The follower maximising count * (100 * static count, or 1 if the static cache lacks it), the first in
    llama.cpp's order on ties; -1 unless the histogram holds ``min_sample`` counts and the pick ``min_percent``
    of them."""
    best = _NULL
    best_score = 0
    best_count = 0
    total = 0
    for token in order:
        count = part[token]
        sc = static.get(token)
        score = count * (100 * sc if sc is not None else 1)
        if score > best_score:
            best, best_score, best_count = token, score, count
        total += count
    if total < min_sample or 100 * best_count < min_percent * total:
        return _NULL
    return best


class NgramCache:
    """ngram-cache ("prompt lookup decoding"): up to 8 tokens, one at a time, from three n-gram caches: the
    context cache built from this sequence's history (n = 4..1, lax thresholds), a dynamic cache (strict
    thresholds), a static cache of 2-grams (validator of the other two, and last resort). See §2.9.

    ``static`` and ``dynamic`` are tables or lookup-cache files (llama.cpp's -lcs / -lcd); they are only read,
    so one table can serve every sequence."""

    name = "ngram-cache"
    n_max = 8  # n_draft, hard-coded in llama.cpp

    def __init__(self, static: NgramCacheTable | str | os.PathLike[str] | None = None,
                 dynamic: NgramCacheTable | str | os.PathLike[str] | None = None) -> None:
        self.static = _as_table(static, "static")
        self.dynamic = _as_table(dynamic, "dynamic")
        self.context = NgramCacheTable()
        self._cache_size = 0  # history tokens (+ id_last) already counted into the context cache

    load = staticmethod(NgramCacheTable.load)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the dynamic cache with this sequence's context cache merged in, as llama-lookup does at exit
        (the drafter's own caches are left unchanged)."""
        merged = self.dynamic.copy()
        merged.merge(self.context)
        merged.save(path)

    def begin(self, prompt: Sequence[int]) -> None:
        pass  # llama.cpp: no-op (the context cache of earlier prompts stays)

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        length = len(history)
        if self._cache_size < length + 1:
            new = [int(t) for t in history[self._cache_size :]]
            new.append(int(id_last))
            self.context.update(new, _NGRAM_MIN, _NGRAM_MAX, len(new))  # an isolated sequence (boundary quirk)
            self._cache_size = length + 1
        if length + 1 < _NGRAM_STATIC:
            return []
        seq = [int(t) for t in history[max(0, length - (_NGRAM_MAX - 1)) :]]
        seq.append(int(id_last))
        context, dynamic, static = self.context, self.dynamic, self.static
        pack = _KEY.pack
        drafted: list[int] = []
        while len(drafted) < self.n_max:
            key_static = pack(seq[-2], seq[-1], _NULL, _NULL)
            part_static = static._parts.get(key_static, {})
            token = _NULL
            for cache, min_sample, min_percent in ((context, _MIN_SAMPLE_LAX, _MIN_PERCENT_LAX),
                                                   (dynamic, _MIN_SAMPLE_STRICT, _MIN_PERCENT_STRICT)):
                # n = 4 down to 1; sizes longer than the tokens there are are skipped (llama.cpp reads before
                # the start of its vector there)
                for n in range(min(_NGRAM_MAX, len(seq)), _NGRAM_MIN - 1, -1):
                    key = pack(*seq[-n:], *_PADS[n])
                    part = cache._parts.get(key)
                    if part is None:
                        continue
                    token = _pick(part, cache._ordered(key, part), part_static,
                                  min_sample[n - 1], min_percent[n - 1])
                    if token != _NULL:
                        break
                if token != _NULL:
                    break
            if token == _NULL and part_static:
                token = _pick(part_static, static._ordered(key_static, part_static), {},
                              _MIN_SAMPLE_LAX[_NGRAM_STATIC - 1], _MIN_PERCENT_LAX[_NGRAM_STATIC - 1])
            if token == _NULL:
                break
            drafted.append(token)
            seq.append(token)
            if len(seq) > _NGRAM_MAX:
                del seq[0]
        return drafted

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# building the drafters and one drafting round (§1.1, §1.2, §1.4)

# every parameter make_drafters takes: (default, lo, hi, llama.cpp flag); None bounds = not an integer
_PARAMS: dict[str, tuple[object, int | None, int | None, str]] = {
    "ngram_simple_size_n": (12, 1, 1024, "--spec-ngram-simple-size-n"),
    "ngram_simple_size_m": (48, 1, 1024, "--spec-ngram-simple-size-m"),
    "ngram_simple_min_hits": (1, 1, 65535, "--spec-ngram-simple-min-hits"),  # unused by llama.cpp (§2.6)
    "ngram_map_k_size_n": (12, 1, 1024, "--spec-ngram-map-k-size-n"),
    "ngram_map_k_size_m": (48, 1, 1024, "--spec-ngram-map-k-size-m"),
    "ngram_map_k_min_hits": (1, 1, 65535, "--spec-ngram-map-k-min-hits"),  # unused by llama.cpp (§2.7)
    "ngram_map_k4v_size_n": (12, 1, 1024, "--spec-ngram-map-k4v-size-n"),
    "ngram_map_k4v_size_m": (48, 1, 1024, "--spec-ngram-map-k4v-size-m"),
    "ngram_map_k4v_min_hits": (1, 1, 65535, "--spec-ngram-map-k4v-min-hits"),
    "ngram_mod_n_match": (24, 1, 1024, "--spec-ngram-mod-n-match"),
    "ngram_mod_n_min": (48, 0, 1024, "--spec-ngram-mod-n-min"),
    "ngram_mod_n_max": (64, 0, 1024, "--spec-ngram-mod-n-max"),
    "ngram_mod_table": (None, None, None, "a shared NgramModTable"),
    "lookup_cache_static": (None, None, None, "--lookup-cache-static"),
    "lookup_cache_dynamic": (None, None, None, "--lookup-cache-dynamic"),
}


def _enabled_types(types: Sequence[str] | str) -> set[str]:
    """The types a list of --spec-type values enables. Each value is a comma-separated list; a value containing
    ``none`` contributes nothing (as llama.cpp, names before the ``none`` are checked, names after it are not);
    an unknown name is an error."""
    if isinstance(types, str):
        types = [types]
    enabled: set[str] = set()
    for value in types:
        if not isinstance(value, str):
            raise ValueError(f"speculative types must be strings, got {value!r}")
        names: list[str] = []
        for name in value.split(","):
            if name not in SPEC_TYPES:
                raise ValueError(f"unknown speculative type: {name!r} (known: {', '.join(SPEC_TYPES)})")
            if name == "none":
                names = []
                break
            names.append(name)
        enabled.update(names)
    return enabled


def make_drafters(types: Sequence[str] | str, **params: object) -> list[Drafter]:
    """The n-gram drafters for one sequence, in llama.cpp's priority order (§1.2): ngram-simple, ngram-map-k,
    ngram-map-k4v, ngram-mod, ngram-cache.

    ``types`` are --spec-type values (each may be a comma-separated list; ``none`` in a value drops that value).
    Draft-model types (draft-simple, draft-eagle3, ...) are valid names but are not built here: they come after
    every n-gram type in the priority order, so the caller appends its draft-model drafter to this list.

    ``params`` (all checked against llama.cpp's ranges, enabled or not): ``ngram_simple_size_n`` /
    ``_size_m`` / ``_min_hits``, the same for ``ngram_map_k_`` and ``ngram_map_k4v_``, ``ngram_mod_n_match`` /
    ``_n_min`` / ``_n_max``, ``ngram_mod_table`` (an ``NgramModTable`` shared by several sequences),
    ``lookup_cache_static`` / ``lookup_cache_dynamic`` (a path or an ``NgramCacheTable``).
    """
    for key in params:
        if key not in _PARAMS:
            raise ValueError(f"unknown speculative parameter {key!r} (known: {', '.join(_PARAMS)})")
    p: dict[str, object] = {}
    for key, (default, lo, hi, flag) in _PARAMS.items():
        value = params.get(key, default)
        if lo is not None and hi is not None:
            value = _check_int(key, value, lo, hi, flag)
        p[key] = value
    table = p["ngram_mod_table"]
    if table is not None:
        if not isinstance(table, NgramModTable):
            raise ValueError(f"ngram_mod_table must be an NgramModTable, got {type(table).__name__}")
        if table.n != p["ngram_mod_n_match"]:
            raise ValueError(f"ngram_mod_table hashes {table.n}-grams, but ngram_mod_n_match is "
                             f"{p['ngram_mod_n_match']}")
    for key in ("lookup_cache_static", "lookup_cache_dynamic"):
        value = p[key]
        if value is not None and not isinstance(value, (NgramCacheTable, str, os.PathLike)):
            raise ValueError(f"{key} must be an NgramCacheTable or a file path, got {type(value).__name__}")

    enabled = _enabled_types(types)
    out: list[Drafter] = []
    for name in NGRAM_TYPES:
        if name not in enabled:
            continue
        if name == "ngram-simple":
            out.append(NgramSimple(p["ngram_simple_size_n"], p["ngram_simple_size_m"]))
        elif name in ("ngram-map-k", "ngram-map-k4v"):
            pre = name.replace("-", "_")
            out.append(NgramMapK(p[f"{pre}_size_n"], p[f"{pre}_size_m"], p[f"{pre}_min_hits"],
                                 values=name == "ngram-map-k4v"))
        elif name == "ngram-mod":
            out.append(NgramMod(p["ngram_mod_n_match"], p["ngram_mod_n_min"], p["ngram_mod_n_max"],
                                table=table))
        else:
            out.append(NgramCache(p["lookup_cache_static"], p["lookup_cache_dynamic"]))
    return out


def draft_round(drafters: Sequence[Drafter], history: Sequence[int], id_last: int,
                n_max: int) -> tuple[list[int], Drafter | None]:
    """One sequence's ``common_speculative_draft``: the drafters in order until one returns a non-empty draft,
    cut to ``n_max`` tokens when ``n_max > 0`` (0 or less = no cap). Returns (draft, winner) or ([], None).

    The caller verifies the draft, then calls ``winner.accept(n, False)`` and ``accept(n, True)`` on the others.
    """
    for drafter in drafters:
        result = drafter.draft(history, id_last)
        if result:
            if n_max > 0:
                result = result[:n_max]
            return result, drafter
    return [], None
