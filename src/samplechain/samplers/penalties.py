"""Repetition, frequency and presence penalties over the last ``last_n`` accepted tokens (llama.cpp's
llama_sampler_penalties_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from samplechain._numeric import F32, f32
from samplechain.candidates import Candidates
from samplechain.samplers.base import DeviceShape, Sampler
from samplechain.validate import check_int, check_number


def device_table(rows, tokens: list[np.ndarray], values: list[np.ndarray]) -> tuple:
    """``[B, w]`` (token, value) tables on the rows' device, unique tokens per row, padded with a spare column
    (``n_vocab``) that the scatter ignores. Tokens outside the rows' vocabulary are left out."""
    import torch

    v = rows.n_vocab
    width = max(1, max(len(t) for t in tokens))
    tok = np.full((rows.batch, width), v, dtype=np.int64)
    val = np.zeros((rows.batch, width), dtype=F32)
    for i, (t, x) in enumerate(zip(tokens, values, strict=True)):
        inside = t < v
        tok[i, : inside.sum()] = t[inside]
        val[i, : inside.sum()] = x[inside]
    return torch.from_numpy(tok).to(rows.device), torch.from_numpy(val).to(rows.device)


def device_scatter_add(rows, table: tuple, fn) -> None:
    """``logits[id] = fn(logits[id], value)`` for each row's (token, value) pairs of ``table``
    (:func:`device_table`). Identity rows gather and scatter the few entries; reordered rows look each
    candidate's value up in a vocabulary-wide table."""
    import torch

    tok_t, val_t = table
    v = rows.n_vocab
    if rows.identity:
        wide = torch.cat((rows.logits, rows.logits.new_zeros(rows.batch, 1)), 1)
        wide.scatter_(1, tok_t, fn(wide.gather(1, tok_t), val_t))
        rows.set_logits(wide[:, :v])
    else:
        lookup = rows.logits.new_zeros(rows.batch, v + 1).scatter_(1, tok_t, val_t)
        hit = rows.logits.new_zeros(rows.batch, v + 1, dtype=torch.bool).scatter_(1, tok_t, True)
        ids = rows.ids
        rows.set_logits(torch.where(hit.gather(1, ids), fn(rows.logits, lookup.gather(1, ids)), rows.logits))


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
        self.freq = f32(check_number("penalty_freq", freq))
        self.present = f32(check_number("penalty_present", present))
        self.disabled = self.last_n == 0 or (self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0)
        self._ring: deque[int] = deque(maxlen=max(self.last_n, 1))
        self._counts: Counter[int] = Counter()

    def params(self) -> dict:
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

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        return None if shape.selected else shape.but(sorted=False)

    def device_input(self) -> tuple[np.ndarray, np.ndarray]:
        """The history's (token, count) table, uploaded with the step."""
        tokens = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        return tokens, np.fromiter(self._counts.values(), dtype=F32, count=len(self._counts))

    def device_apply(self, rows, members) -> None:
        import torch

        repeat = rows.param(members, "repeat")
        freq = rows.param(members, "freq")
        present = rows.param(members, "present")

        def penalize(x, cnt):
            x = torch.where(x <= 0.0, x * repeat, x / repeat)
            return x - (cnt * freq + (cnt > 0.0).to(x.dtype) * present)

        inputs = rows.step_input()
        rows.to_mask()  # the order may change
        device_scatter_add(rows, device_table(rows, [t for t, _ in inputs], [c for _, c in inputs]), penalize)
