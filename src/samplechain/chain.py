"""``Chain``: samplers applied in order, with accept fan-out, reset, clone and perf counters (spec §2.4)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from samplechain.candidates import Candidates
from samplechain.samplers.base import Sampler


@dataclass
class PerfCounters:
    """llama.cpp's sampler perf data: time in apply + accept, and the number of accepts."""

    t_sample_ms: float = 0.0
    n_sample: int = 0


class Chain(Sampler):
    """An ordered list of samplers that acts as one sampler."""

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = (), *, perf: bool = False) -> None:
        self.samplers: list[Sampler] = []
        for s in samplers:
            self.add(s)
        self.perf_enabled = perf
        self._t_us = 0.0
        self._n_sample = 0

    def add(self, sampler: Sampler) -> None:
        if not isinstance(sampler, Sampler):
            raise ValueError(f"a chain holds samplers, got {type(sampler).__name__}")
        self.samplers.append(sampler)

    def remove(self, i: int) -> Sampler:
        return self.samplers.pop(i)

    def __getitem__(self, i: int) -> Sampler:
        return self.samplers[i]

    def __len__(self) -> int:
        return len(self.samplers)

    def __iter__(self) -> Iterator[Sampler]:
        return iter(self.samplers)

    def apply(self, c: Candidates) -> None:
        t0 = time.perf_counter() if self.perf_enabled else 0.0
        for s in self.samplers:
            s.apply(c)
        if self.perf_enabled:
            self._t_us += (time.perf_counter() - t0) * 1e6

    def accept(self, token: int) -> None:
        t0 = time.perf_counter() if self.perf_enabled else 0.0
        for s in self.samplers:
            s.accept(token)
        if self.perf_enabled:
            self._t_us += (time.perf_counter() - t0) * 1e6
        self._n_sample += 1

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def clone(self) -> Chain:
        return Chain((s.clone() for s in self.samplers), perf=self.perf_enabled)

    def sample(self, logits: np.ndarray | Iterable[float]) -> int:
        """Build candidates from ``logits``, apply the chain, accept the selected token and return it."""
        c = Candidates.from_logits(logits)
        self.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"no sampler selected a token ({self.describe()}); end the chain with a selector")
        token = int(c.ids[c.selected])
        self.accept(token)
        return token

    @property
    def perf(self) -> PerfCounters:
        return PerfCounters(self._t_us / 1000.0, max(0, self._n_sample))

    def perf_reset(self) -> None:
        self._t_us = 0.0
        self._n_sample = 0

    @property
    def seed(self) -> int | None:
        """The effective seed of the last seeded dist/mirostat member (llama.cpp's ``get_seed``), else None."""
        for s in reversed(self.samplers):
            if s.name in ("dist", "mirostat", "mirostat-v2"):
                return s.seed_cur
        return None

    def describe(self) -> str:
        return " -> ".join(["logits"] + [s.display_name for s in self.samplers])

    def __repr__(self) -> str:
        return f"Chain([{', '.join(map(repr, self.samplers))}])"
