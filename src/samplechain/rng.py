"""llama.cpp-exact random draws: ``std::mt19937`` and libstdc++'s canonical and discrete distributions.

As in llama.cpp's src/llama-sampler.cpp (``get_rng_seed``, ``llama_sampler_dist_apply``, ``llama_sample_dist``),
one :class:`LlamaRng` per sampler; the same seed gives the same words, uniforms and discrete draws as llama.cpp
built with GCC/libstdc++.
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


# Words are generated a block at a time; this many already-read words stay readable again (rewind).
_BLOCK = 624
_HISTORY = 64


class LlamaRng:
    """A private ``std::mt19937`` with libstdc++'s ``uniform_real_distribution`` and ``discrete_distribution``.

    The 32-bit words are generated a block at a time and read from a buffer, so :meth:`mark` and
    :meth:`rewind` can take back the last few draws cheaply (the device sampler draws before it knows whether
    a row will be redone on the CPU). The buffer (``_buf``, a list of ints) and the position of the next unread word
    (``_pos``) are also read by the chain's compiled step (chain.py ``_FusedTail.sample``, csrc/sampling.c), which
    draws :meth:`uniform_double` from two of them without a Python call.
    """

    __slots__ = ("_base", "_buf", "_mt", "_pos")

    def __init__(self, seed: int) -> None:
        self._mt = random.Random()
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self._mt.setstate(_mt_state(seed & 0xFFFFFFFF))
        self._buf: list[int] = []
        self._pos = 0
        self._base = 0  # how many words were read before _buf[0]

    def _refill(self) -> None:
        keep = min(self._pos, _HISTORY)
        block = self._mt.getrandbits(32 * _BLOCK).to_bytes(4 * _BLOCK, "little")  # first word least significant
        self._base += self._pos - keep
        self._buf = self._buf[self._pos - keep : self._pos] + np.frombuffer(block, dtype="<u4").tolist()
        self._pos = keep

    def next_u32(self) -> int:
        if self._pos >= len(self._buf):
            self._refill()
        w = self._buf[self._pos]
        self._pos += 1
        return w

    def mark(self) -> int:
        """The position in the word stream, for :meth:`rewind`."""
        return self._base + self._pos

    def rewind(self, mark: int) -> None:
        """Return to ``mark`` (at most 64 words back across a block boundary); later draws repeat exactly."""
        pos = mark - self._base
        if not 0 <= pos <= len(self._buf):
            raise ValueError("the generator cannot rewind that far")
        self._pos = pos

    def uniform_double(self) -> float:
        """``uniform_real_distribution<double>(0, 1)``: two words, the first least significant, one rounding."""
        pos = self._pos
        buf = self._buf
        if pos + 2 <= len(buf):  # both words in the buffer (all but one draw in 312)
            self._pos = pos + 2
            u = float(buf[pos] | (buf[pos + 1] << 32)) / _TWO_POW_64
        else:
            lo = self.next_u32()
            u = float(lo | (self.next_u32() << 32)) / _TWO_POW_64
        return _ONE_BELOW_1_F64 if u >= 1.0 else u

    def uniform_float(self) -> np.float32:
        """``uniform_real_distribution<float>(0, 1)``: one word rounded to binary32, divided by 2**32."""
        u = np.float32(self.next_u32()) / _TWO_POW_32_F32
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
        return self._mt.getstate(), list(self._buf), self._pos, self._base

    def setstate(self, state: object) -> None:
        mt, buf, self._pos, self._base = state
        self._mt.setstate(mt)
        self._buf = list(buf)

    def clone(self) -> LlamaRng:
        other = LlamaRng.__new__(LlamaRng)
        other._mt = random.Random()
        other.setstate(self.getstate())
        return other
