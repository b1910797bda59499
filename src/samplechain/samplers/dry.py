"""DRY ("don't repeat yourself"): penalises tokens that would extend a repeated sequence (llama.cpp's
llama_sampler_dry_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from samplechain._numeric import F32, F64, logf
from samplechain.candidates import Candidates
from samplechain.samplers.base import Sampler
from samplechain.samplers.penalties import positions_of
from samplechain.validate import check_int, check_number

if TYPE_CHECKING:
    from samplechain.vocab import Vocab

DEFAULT_SEQ_BREAKERS = ("\n", ":", '"', "*")
_MAX_BREAKER_BYTES = 40
_MAX_TAIL_TOKENS = 20
_MAX_CACHED = 16  # breaker sets kept per vocabulary
_FLOAT_MAX_LOG = F32(88.7228391)

Breakers = dict[int, tuple[tuple[int, ...], ...]]  # head token -> tails (an empty tail: single-token breaker)


def process_breakers(vocab: Vocab, breakers: Iterable[str]) -> Breakers:
    """llama.cpp's breaker preprocessing: every token that contains a breaker, or ends with a proper prefix
    of one, becomes a head; its tail is the tokenization of the rest of the breaker. The last ``_MAX_CACHED`` sets
    are cached per vocabulary."""
    key = tuple(breakers)
    cache = vocab.dry_breakers
    if key in cache:
        cache[key] = cache.pop(key)  # the most recently used last
        return cache[key]
    heads: dict[int, list[tuple[int, ...]]] = {}
    for breaker in key:
        if not isinstance(breaker, str):
            raise ValueError(f"DRY sequence breakers must be strings, got {breaker!r}")
        b = breaker.encode("utf-8")[:_MAX_BREAKER_BYTES]
        if not b:
            continue
        first = b[:1]
        for token in range(vocab.n_tokens):
            text = vocab.token_bytes(token)
            if b in text:
                tails = heads.setdefault(token, [])
                if () not in tails:
                    tails.append(())
                continue
            q = text.find(first)
            while q != -1:
                rest = text[q:]
                if b.startswith(rest):
                    tail = tuple(vocab.tokenize_bytes(b[len(rest):])[:_MAX_TAIL_TOKENS])
                    tails = heads.setdefault(token, [])
                    if tail not in tails:
                        tails.append(tail)
                q = text.find(first, q + 1)
    result = {head: tuple(tails) for head, tails in heads.items()}
    cache[key] = result
    while len(cache) > _MAX_CACHED:  # the oldest set goes: a server sees any number of breaker sets
        cache.pop(next(iter(cache)))
    return result


def z_function(s: Sequence[int]) -> list[int]:
    """``z[k]`` = length of the longest common prefix of ``s`` and ``s[k:]`` (``z[0] = len(s)``)."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    lt = rt = 0
    for k in range(1, n):
        zk = min(rt - k, z[k - lt]) if k < rt else 0
        while k + zk < n and s[zk] == s[k + zk]:
            zk += 1
        z[k] = zk
        if k + zk > rt:
            lt, rt = k, k + zk
    return z


class DRY(Sampler):
    """Subtracts ``multiplier * base**(len - allowed_length)`` from tokens that would extend a repeat."""

    name = "dry"

    def __init__(
        self,
        vocab: Vocab | None,
        multiplier: float,
        base: float,
        allowed_length: int,
        last_n: int,
        seq_breakers: Iterable[str] = DEFAULT_SEQ_BREAKERS,
    ) -> None:
        self._init_params(multiplier, base, allowed_length, last_n)
        breakers = [seq_breakers] if isinstance(seq_breakers, str) else list(seq_breakers)
        if self.disabled or not breakers:
            self.breakers: Breakers = {}
        else:
            if vocab is None:
                raise ValueError("DRY needs a vocabulary to process its sequence breakers")
            self.breakers = process_breakers(vocab, breakers)

    @classmethod
    def from_token_breakers(
        cls, multiplier: float, base: float, allowed_length: int, last_n: int,
        breakers: Iterable[Sequence[int]] = (),
    ) -> DRY:
        """DRY with breakers given as token sequences (head = first token, tail = the rest)."""
        self = cls.__new__(cls)
        self._init_params(multiplier, base, allowed_length, last_n)
        heads: dict[int, list[tuple[int, ...]]] = {}
        for seq in breakers:
            seq = [check_int("breaker token", t, minimum=0) for t in seq]
            if seq:
                tails = heads.setdefault(seq[0], [])
                if tuple(seq[1:]) not in tails:
                    tails.append(tuple(seq[1:]))
        self.breakers = {h: tuple(t) for h, t in heads.items()}
        return self

    def _init_params(self, multiplier: float, base: float, allowed_length: int, last_n: int) -> None:
        self.multiplier = F32(check_number("dry_multiplier", multiplier))
        self.base = F32(check_number("dry_base", base))
        self.allowed_length = check_int("dry_allowed_length", allowed_length, minimum=0)
        self.last_n = max(check_int("dry_penalty_last_n", last_n), 0)  # library semantics: negative = off
        self.disabled = self.multiplier == 0.0 or self.base < 1.0 or self.last_n == 0
        self._ring: deque[int] = deque(maxlen=max(self.last_n, 1))
        self._max_exp = int(_FLOAT_MAX_LOG / logf(self.base)) if self.base > F32(1.000001) else 0

    def params(self) -> dict:
        return {"multiplier": float(self.multiplier), "base": float(self.base),
                "allowed_length": self.allowed_length, "last_n": self.last_n}

    def accept(self, token: int) -> None:
        if not self.disabled:
            self._ring.append(int(token))

    def reset(self) -> None:
        self._ring.clear()

    def _rep_limit(self, h: list[int]) -> int:
        """Tokens since the end of the most recent sequence breaker (all of the window if none)."""
        for i, token in enumerate(h):
            tails = self.breakers.get(token)
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                n = len(tail)
                if longest < n <= i and all(tail[o] == h[i - 1 - o] for o in range(n)):
                    longest = n
            if longest >= 0:
                return i - longest
        return len(h)

    def penalties(self) -> dict[int, int] | None:
        """``{token: longest repeat it would extend}`` for the current history; None when DRY exits early
        (history no longer than ``allowed_length``, or a breaker too recent)."""
        n = len(self._ring)
        if n <= self.allowed_length:
            return None
        h = list(reversed(self._ring))  # h[i]: i-th most recent token
        rep_limit = self._rep_limit(h)
        if rep_limit < self.allowed_length:
            return None
        z = z_function(h)
        worst: dict[int, int] = {}
        for k in range(1, n):
            rep = min(z[k], rep_limit)
            if rep >= self.allowed_length:
                token = h[k - 1]  # the token that followed the earlier occurrence
                if worst.get(token, -1) < rep:
                    worst[token] = rep
        return worst

    def apply(self, c: Candidates) -> None:
        if self.disabled:
            return
        worst = self.penalties()
        if worst is None:
            return
        tokens = np.array([t for t in worst if () not in self.breakers.get(t, ())], dtype=np.int64)
        if len(tokens):
            pos, which = positions_of(c, tokens)
            if len(pos):
                exps = np.array([worst[int(t)] - self.allowed_length for t in tokens], dtype=np.int64)
                if self._max_exp > 0:
                    exps = np.minimum(exps, self._max_exp)
                penalty = (F64(self.multiplier) * np.power(F64(self.base), exps.astype(F64))).astype(F32)
                x = c.logits.copy()
                x[pos] -= penalty[which]
                c.set_logits(x)
        c.sorted = False
