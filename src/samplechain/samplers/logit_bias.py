"""Logit bias: fixed additive biases per token id; ``-inf`` bans a token (llama.cpp's llama_sampler_logit_bias_apply,
src/llama-sampler.cpp)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from samplechain._numeric import F32, f32
from samplechain.candidates import Candidates
from samplechain.samplers.base import DeviceShape, Sampler
from samplechain.samplers.penalties import device_scatter_add, device_table, positions_of
from samplechain.validate import check_int, check_number


def normalize_biases(
    biases: Mapping[int, float] | Iterable[tuple[int, float]], n_vocab: int | None
) -> dict[int, float]:
    """Validated ``{token: bias}``; duplicate tokens are summed (llama.cpp sums them only on one path).

    llama.cpp's CPU sampler adds every entry when it can index by id, but on its search path only the first
    entry of a token counts."""
    items = biases.items() if isinstance(biases, Mapping) else biases
    out: dict[int, float] = {}
    for item in items:
        try:
            token, bias = item
        except (TypeError, ValueError):
            raise ValueError(f"logit bias entries must be (token, bias) pairs, got {item!r}") from None
        token = check_int("logit bias token", token, minimum=0)
        if n_vocab is not None and token >= n_vocab:
            raise ValueError(f"logit bias token {token} is outside the vocabulary [0, {n_vocab})")
        bias = check_number(f"logit bias of token {token}", bias, finite=False)
        if bias == np.inf:
            raise ValueError(f"logit bias of token {token} must not be +inf (use a finite value)")
        out[token] = float(f32(out.get(token, 0.0) + bias))
    return out


class LogitBias(Sampler):
    """Adds a fixed bias to chosen tokens' logits."""

    name = "logit-bias"

    def __init__(self, n_vocab: int | None, biases: Mapping[int, float] | Iterable[tuple[int, float]]) -> None:
        self.n_vocab = None if n_vocab is None else check_int("n_vocab", n_vocab, minimum=1)
        self.biases = normalize_biases(biases, self.n_vocab)
        self.disabled = not self.biases
        self._tokens = np.fromiter(self.biases.keys(), dtype=np.int64, count=len(self.biases))
        self._values = np.fromiter(self.biases.values(), dtype=F32, count=len(self.biases))

    def params(self) -> dict:
        return {"n_vocab": self.n_vocab, "biases": self.biases}

    def apply(self, c: Candidates) -> None:
        if self.disabled:
            return
        if c.identity and self.n_vocab is None and len(self._tokens) and self._tokens.max() >= len(c):
            raise ValueError(f"logit bias token {int(self._tokens.max())} is outside the vocabulary [0, {len(c)})")
        pos, which = positions_of(c, self._tokens)
        if len(pos):
            x = c.logits.copy()
            x[pos] += self._values[which]
            c.set_logits(x)
            # llama.cpp keeps the sorted flag although the order may have changed.
            c.sorted = False

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        # on the full vocabulary only (llama.cpp's device form assumed it; common puts the bias first)
        return shape.but(sorted=False) if shape.identity and not shape.selected else None

    def device_apply(self, rows, members) -> None:
        device_scatter_add(rows, rows.constant("table", lambda: _bias_table(rows, members)),
                           lambda x, bias: x + bias)
        rows.to_mask()


def _bias_table(rows, members: list[LogitBias]) -> tuple:
    """The members' biases as a device table, built once per batch composition."""
    for m in members:
        if m.n_vocab is None and len(m._tokens) and m._tokens.max() >= rows.n_vocab:
            raise ValueError(f"logit bias token {int(m._tokens.max())} is outside the vocabulary "
                             f"[0, {rows.n_vocab})")
    return device_table(rows, [m._tokens for m in members], [m._values for m in members])
