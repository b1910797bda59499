"""What ``BatchSampler`` needs of one row's sampler: its samplers, a CPU fallback, accept and a record hook.

``CommonSampler`` (params, a layer above this one) satisfies :class:`RowSampler` as it is; a bare ``Chain`` is
wrapped in :class:`ChainRow`. The device layer never imports the policy layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.samplers.base import Sampler


@runtime_checkable
class RowSampler(Protocol):
    """One sequence's sampler as the device path drives it."""

    @property
    def samplers(self) -> Sequence[Sampler]:
        """The chain's samplers, in order: the device prefix is planned from them."""

    @property
    def cpu_only(self) -> bool:
        """True when every step must run whole through :meth:`sample` (a grammar, a reasoning budget)."""

    def sample(self, logits: np.ndarray) -> int:
        """The whole step on the CPU from full-vocabulary logits: select, record and accept the token."""

    def accept(self, token: int, is_generated: bool = False) -> None:
        """``token`` joined the sequence (``is_generated``: it was sampled, not given)."""

    def record(self, candidates: Candidates | Callable[[], Candidates]) -> None:
        """The step's final candidates, as ``sample`` would have left them (or a function building them on first
        read); what ``candidates`` / ``top_probs`` report afterwards."""


class ChainRow:
    """A bare :class:`Chain` as a :class:`RowSampler` (it keeps no record of the step's candidates)."""

    __slots__ = ("chain",)

    cpu_only = False

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    @property
    def samplers(self) -> Sequence[Sampler]:
        return self.chain.samplers

    def sample(self, logits: np.ndarray) -> int:
        return self.chain.sample(logits)

    def accept(self, token: int, is_generated: bool = False) -> None:
        self.chain.accept(token)

    def record(self, candidates: Candidates | Callable[[], Candidates]) -> None:
        pass
