"""Adaptive-p: a selector that reshapes probabilities around an adapting target (llama.cpp's
llama_sampler_adaptive_p_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import F32
from samplechain.candidates import Candidates
from samplechain.rng import DEFAULT_SEED
from samplechain.samplers._ops import softmax
from samplechain.samplers.base import SELECTOR
from samplechain.samplers.selectors import SeededSampler
from samplechain.validate import check_number

_PEAK = F32(5.0)
_SHARPNESS = F32(10.0)
_INV_WIDTH = F32(1.0) / F32(0.3)


class AdaptiveP(SeededSampler):
    """Draws from probabilities remapped so tokens near an adapting target probability are preferred.

    ``target < 0`` draws from the plain softmax. Must be the last sampler of a chain.
    """

    name = "adaptive-p"
    effect = SELECTOR

    def __init__(self, target: float, decay: float, seed: int = DEFAULT_SEED) -> None:
        self.target = F32(check_number("adaptive_target", target))
        self.decay = F32(min(max(check_number("adaptive_decay", decay), 0.0), 0.99))
        super().__init__(seed)
        self._init_state()

    def _init_state(self) -> None:
        self.weighted_sum = self.target / (F32(1.0) - self.decay)
        self.total_weight = F32(1.0) / (F32(1.0) - self.decay)
        self._pending: tuple[int, int] | None = None
        self._original: np.ndarray | None = None

    def params(self) -> dict:
        return {"target": float(self.target), "decay": float(self.decay), "seed": self.seed}

    def reset(self) -> None:
        self._init_state()
        super().reset()

    def apply(self, c: Candidates) -> None:
        if len(c) == 0:
            c.selected = -1
            return
        probs = softmax(c, do_sort=False)
        if self.target < 0.0:
            c.selected = self.rng.discrete(probs)
            return
        self._original = probs
        tgt = min(max(self.target, F32(0.0)), F32(1.0))
        adapted = min(max(F32(F32(2.0) * tgt) - self.weighted_sum / self.total_weight, F32(0.0)), F32(1.0))
        x = c.logits
        finite = x != -np.inf
        dist = np.abs((probs - adapted) * _INV_WIDTH)
        remapped = _PEAK - _SHARPNESS * dist * dist / (F32(1.0) + dist)
        c.set_logits(np.where(finite, remapped, x).astype(F32))
        idx = self.rng.discrete(softmax(c, do_sort=False))
        c.selected = idx
        self._pending = (int(c.ids[idx]), idx)

    def accept(self, token: int) -> None:
        if self._pending is not None and int(token) == self._pending[0]:
            p = self._original[self._pending[1]]
            self.weighted_sum = F32(p + self.decay * self.weighted_sum)
            self.total_weight = F32(F32(1.0) + self.decay * self.total_weight)
        self._pending = None
