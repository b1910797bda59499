"""ngram-cache (common/ngram-cache.cpp): llama.cpp's lookup caches (context, dynamic, static), their file
format and libstdc++'s iteration order, which breaks ties when drafting."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence

import numpy as np

from samplechain.speculative.ngram.common import MASK64
from samplechain.validate import check_int_range

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
            order = [tokens[i] for i in _stl_order([t & MASK64 for t in tokens])]  # std::hash<int>: the value
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
        check_int_range("ngram_min", ngram_min, 1, _NGRAM_MAX)
        check_int_range("ngram_max", ngram_max, ngram_min, _NGRAM_MAX)
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
        check_int_range("ngram_size", ngram_size, 1, _NGRAM_MAX)
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
    thresholds), a static cache of 2-grams (validator of the other two, and last resort).

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
