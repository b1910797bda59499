"""The sampler protocol: ``name``, ``apply``, ``accept``, ``reset``, ``clone`` with no-op defaults."""

from __future__ import annotations

import copy
from typing import ClassVar

from samplechain.candidates import Candidates

FILTER = "filter"  # removes or masks candidates; cannot change the argmax among survivors
TRANSFORM = "transform"  # reshapes the distribution
SELECTOR = "selector"  # picks a token


class Sampler:
    """Base class. A stateless sampler writes only :meth:`apply`.

    ``disabled`` samplers (llama.cpp's ``?name`` placeholders, spec/samplers §2.2) do nothing; chains built
    from :class:`~samplechain.SamplingParams` leave them out.
    """

    name: ClassVar[str] = ""
    effect: ClassVar[str] = TRANSFORM
    disabled: bool = False

    def apply(self, c: Candidates) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """``token`` became part of the sequence."""

    def reset(self) -> None:
        """Back to the just-constructed state (samplers with a random seed draw a new one)."""

    def clone(self) -> Sampler:
        """An independent exact copy of the current state."""
        return copy.deepcopy(self)

    @property
    def display_name(self) -> str:
        """llama.cpp's name, ``?name`` for a disabled placeholder."""
        return "?" + self.name if self.disabled else self.name

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({fields})"

    def _params(self) -> dict:
        return {}
