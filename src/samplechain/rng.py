"""llama.cpp-exact random draws: ``std::mt19937`` and libstdc++'s canonical and discrete distributions.

spec/samplers §4. One :class:`LlamaRng` per sampler; the same seed gives the same words, uniforms and
discrete draws as llama.cpp built with GCC/libstdc++.
"""

from __future__ import annotations

import random
import secrets

import numpy as np

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: pick a random seed

_TWO_POW_64 = 18446744073709551616.0
_ONE_BELOW_1_F64 = 1.0 - 2.0**-53
_TWO_POW_32_F32 = np.float32(4294967296.0)
_ONE_BELOW_1_F32 = np.float32(1.0 - 2.0**-24)


def check_seed(seed: int) -> int:
    """Validate a seed: an int in [0, 2**32 - 1], or -1 for :data:`DEFAULT_SEED`."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    seed = int(seed)
    if seed == -1:
        return DEFAULT_SEED
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"seed must be in [0, 4294967295] or -1 for a random seed, got {seed}")
    return seed


def resolve_seed(seed: int) -> int:
    """llama.cpp's ``get_rng_seed``: the seed itself, or a fresh random 32-bit value for DEFAULT_SEED."""
    return secrets.randbits(32) if seed == DEFAULT_SEED else seed


def _mt_state(seed: int) -> tuple:
    """The 624-word state of ``std::mt19937(seed)`` (classic single-word initialisation)."""
    key = np.random.RandomState(seed).get_state()[1]
    return (3, (*tuple(int(w) for w in key), 624), None)


class LlamaRng:
    """A private ``std::mt19937`` with libstdc++'s ``uniform_real_distribution`` and ``discrete_distribution``."""

    __slots__ = ("_mt",)

    def __init__(self, seed: int) -> None:
        self._mt = random.Random()
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self._mt.setstate(_mt_state(seed & 0xFFFFFFFF))

    def next_u32(self) -> int:
        return self._mt.getrandbits(32)

    def uniform_double(self) -> float:
        """``uniform_real_distribution<double>(0, 1)``: two words, the first least significant, one rounding."""
        # getrandbits(64) puts the first 32-bit word in the low half, exactly like generate_canonical.
        u = float(self._mt.getrandbits(64)) / _TWO_POW_64
        return _ONE_BELOW_1_F64 if u >= 1.0 else u

    def uniform_float(self) -> np.float32:
        """``uniform_real_distribution<float>(0, 1)``: one word rounded to binary32, divided by 2**32."""
        u = np.float32(self._mt.getrandbits(32)) / _TWO_POW_32_F32
        return _ONE_BELOW_1_F32 if u >= 1.0 else u

    def discrete(self, probs: np.ndarray) -> int:
        """``std::discrete_distribution<int>(probs)(rng)``; consumes nothing for fewer than two weights."""
        n = len(probs)
        if n < 2:
            return 0
        w = np.asarray(probs, dtype=np.float64)
        total = np.cumsum(w)[-1]
        cdf = np.cumsum(w / total)
        cdf[-1] = 1.0
        return int(np.searchsorted(cdf, self.uniform_double(), side="left"))

    def getstate(self) -> object:
        return self._mt.getstate()

    def setstate(self, state: object) -> None:
        self._mt.setstate(state)

    def clone(self) -> LlamaRng:
        other = LlamaRng.__new__(LlamaRng)
        other._mt = random.Random()
        other._mt.setstate(self._mt.getstate())
        return other
