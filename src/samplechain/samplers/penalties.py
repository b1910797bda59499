"""Repetition, frequency and presence penalties over the last ``last_n`` accepted tokens (spec §3.13)."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from samplechain._numeric import F32
from samplechain.candidates import Candidates
from samplechain.samplers._ops import check_int, check_number
from samplechain.samplers.base import Sampler


def positions_of(c: Candidates, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``c`` of the candidates whose id is in ``tokens`` (unique ids), and which token each is.

    Returns ``(pos, which)`` with ``c.ids[pos] == tokens[which]``.
    """
    if c.identity:
        which = np.flatnonzero(tokens < len(c))
        return tokens[which].astype(np.intp), which
    order = np.argsort(tokens)
    sorted_tokens = tokens[order]
    ids = c.ids
    j = np.searchsorted(sorted_tokens, ids)
    j[j == len(sorted_tokens)] = 0
    pos = np.flatnonzero(sorted_tokens[j] == ids) if len(sorted_tokens) else np.empty(0, dtype=np.intp)
    return pos, order[j[pos]]


class Penalties(Sampler):
    """llama.cpp's penalties: repeat (divide positive / multiply negative logits), frequency, presence."""

    name = "penalties"

    def __init__(self, last_n: int, repeat: float, freq: float, present: float) -> None:
        self.last_n = max(check_int("penalty_last_n", last_n), 0)  # library semantics: negative = disabled
        repeat = check_number("penalty_repeat", repeat)
        if not repeat > 0.0 or not np.isfinite(1.0 / repeat):
            raise ValueError(f"penalty_repeat must be > 0 with a finite reciprocal, got {repeat}")
        self.repeat = F32(repeat)
        self.freq = F32(check_number("penalty_freq", freq))
        self.present = F32(check_number("penalty_present", present))
        self.disabled = self.last_n == 0 or (self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0)
        self._ring: deque[int] = deque(maxlen=max(self.last_n, 1))
        self._counts: Counter[int] = Counter()

    def _params(self) -> dict:
        return {"last_n": self.last_n, "repeat": float(self.repeat), "freq": float(self.freq),
                "present": float(self.present)}

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        token = int(token)
        if len(self._ring) == self._ring.maxlen:
            old = self._ring[0]
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._ring.append(token)
        self._counts[token] += 1

    def reset(self) -> None:
        self._ring.clear()
        self._counts.clear()

    def apply(self, c: Candidates) -> None:
        if self.disabled:
            return
        if self._counts:
            tokens = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=F32, count=len(self._counts))
            pos, which = positions_of(c, tokens)
            if len(pos):
                x = c.logits.copy()
                v = x[pos]
                v = np.where(v <= 0.0, v * self.repeat, v / self.repeat)
                cnt = counts[which]
                v = v - (cnt * self.freq + np.where(cnt > 0, F32(1.0), F32(0.0)) * self.present)
                x[pos] = v
                c.set_logits(x)
        c.sorted = False
