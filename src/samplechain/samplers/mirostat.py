"""Mirostat 1 and 2: selectors that steer the surprise of each token towards ``tau`` (llama.cpp's
llama_sampler_mirostat_apply and llama_sampler_mirostat_v2_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

import math

import numpy as np

from samplechain._numeric import F32, log2f, logf, logf_array, powf, seq_sum_f32
from samplechain.candidates import Candidates
from samplechain.samplers._ops import apply_top_k, softmax
from samplechain.samplers.base import SELECTOR
from samplechain.samplers.selectors import SeededSampler
from samplechain.validate import check_int, check_number

_INT32_MAX = 2**31 - 1


class _MirostatBase(SeededSampler):
    effect = SELECTOR

    def __init__(self, seed: int, tau: float, eta: float) -> None:
        self.tau = F32(check_number("mirostat_tau", tau))
        self.eta = F32(check_number("mirostat_eta", eta))
        self.mu = F32(2.0) * self.tau
        super().__init__(seed)

    def reset(self) -> None:
        self.mu = F32(2.0) * self.tau
        super().reset()

    def _draw(self, c: Candidates) -> None:
        probs = softmax(c, do_sort=True)
        idx = self.rng.discrete(probs)
        c.selected = idx
        surprise = -log2f(probs[idx])
        self.mu = F32(self.mu - self.eta * F32(surprise - self.tau))


class Mirostat(_MirostatBase):
    """Mirostat 1.0: estimates the Zipf exponent from the top ``m`` tokens, then top-k with a derived k."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100) -> None:
        self.n_vocab = check_int("n_vocab", n_vocab, minimum=1)
        self.m = check_int("m", m)
        super().__init__(seed, tau, eta)

    def params(self) -> dict:
        return {"n_vocab": self.n_vocab, "seed": self.seed, "tau": float(self.tau), "eta": float(self.eta),
                "m": self.m}

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if n == 0:
            c.selected = -1
            return
        probs = softmax(c, do_sort=True)
        # (m - 1) as size_t: m <= 0 wraps around to "all entries"
        limit = min(self.m - 1 if self.m > 0 else n, n - 1)
        k = self._estimate_k(probs, limit)
        apply_top_k(c, k)
        self._draw(c)

    def _estimate_k(self, probs: np.ndarray, limit: int) -> int:
        i = np.arange(limit, dtype=F32)
        t = logf_array((i + F32(2.0)) / (i + F32(1.0)))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = logf_array(probs[:limit] / probs[1 : limit + 1])
            sum_ti_bi = seq_sum_f32(t * b)
            sum_ti_sq = seq_sum_f32(t * t)
            s_hat = F32(sum_ti_bi / sum_ti_sq)
            eps = F32(s_hat - F32(1.0))
            num = F32(eps * powf(2.0, self.mu))
            den = F32(F32(1.0) - powf(float(self.n_vocab), float(-eps)))
            k = powf(float(F32(num / den)), float(F32(F32(1.0) / s_hat)))
        # The C++ float -> int conversion of a NaN/inf k is undefined (x86: INT_MIN -> clamped to 1); we map
        # non-finite k to 1 and clamp finite k to [1, n].
        if not math.isfinite(float(k)):
            return 1
        return max(1, min(int(k), _INT32_MAX))


class MirostatV2(_MirostatBase):
    """Mirostat 2.0: keeps tokens whose surprise is at most ``mu``, then draws."""

    name = "mirostat-v2"

    def __init__(self, seed: int, tau: float, eta: float) -> None:
        super().__init__(seed, tau, eta)

    def params(self) -> dict:
        return {"seed": self.seed, "tau": float(self.tau), "eta": float(self.eta)}

    def apply(self, c: Candidates) -> None:
        if len(c) == 0:
            c.selected = -1
            return
        probs = softmax(c, do_sort=True)
        with np.errstate(divide="ignore"):
            surprise = -np.log2(probs.astype(np.float64)).astype(F32)
        over = np.flatnonzero(surprise > self.mu)
        keep = int(over[0]) if len(over) else len(probs)
        c.truncate(max(keep, 1))
        self._draw(c)


__all__ = ["Mirostat", "MirostatV2", "logf"]
