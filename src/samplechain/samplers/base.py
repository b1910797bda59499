"""The sampler protocol: ``name``, ``apply``, ``accept``, ``reset``, ``clone`` with no-op defaults."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from samplechain.candidates import Candidates

if TYPE_CHECKING:  # samplechain.rows imports torch; the samplers import it only inside their device forms
    from samplechain.rows import Rows

FILTER = "filter"  # removes or masks candidates; cannot change the argmax among survivors
TRANSFORM = "transform"  # reshapes the distribution
SELECTOR = "selector"  # picks a token


# Bumped by every attribute assignment on a Watched sampler (the members chain.py fuses): the fused step caches its
# members' parameters and remakes them when this moved (one comparison per token, not a dozen attribute reads).
changes = [0]

# Device rows up to this width replay llama.cpp's sequential binary32 sums exactly, column by column.
DEVICE_SMALL_WIDTH = 128


@dataclass(frozen=True)
class DeviceShape:
    """What a device prefix knows statically about its rows before a sampler runs.

    ``width``: the row width if a sampler fixed it (top-k), None for the full vocabulary; ``identity``: ids are
    the positions; ``sorted``: the candidates are in llama.cpp's sorted order; ``selected``: a token is chosen.
    """

    width: int | None = None
    identity: bool = True
    sorted: bool = False
    selected: bool = False

    def but(self, **changes: object) -> DeviceShape:
        return replace(self, **changes)


class Sampler:
    """Base class. A stateless sampler writes only :meth:`apply`.

    ``disabled`` samplers (llama.cpp's ``?name`` placeholders, llama_sampler_init_empty) do nothing; chains built
    from :class:`~samplechain.SamplingParams` leave them out.
    """

    name: ClassVar[str] = ""
    effect: ClassVar[str] = TRANSFORM
    disabled: bool = False

    def apply(self, c: Candidates) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """``token`` became part of the sequence."""

    # --- device form (samplechain.device): the same semantics on a batch of rows of torch tensors ------------

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        """The shape after this sampler runs on the device, or None if it has no device form for ``shape``.

        A sampler with a device form overrides this and :meth:`device_apply`; a disabled one is a no-op anywhere.
        """
        return shape if self.disabled else None

    def device_key(self) -> tuple:
        """Static choices of the device form; rows batch together only when every key of their prefix agrees."""
        return ()

    def device_apply(self, rows: Rows, members: Sequence[Sampler]) -> None:
        """Apply the device form to ``rows``; ``members[i]`` is this position's sampler of row i (same type)."""
        raise NotImplementedError

    def device_input(self) -> object:
        """This step's host-side input of the device form, computed before the step and uploaded with it: a tuple
        of numbers (a uniform from the sampler's own generator), written into the step's static buffer, or
        anything else (a history table), handed over as it is. Only samplers that need one define it."""
        raise NotImplementedError

    def device_record(self, c: Candidates) -> None:
        """``c`` holds this selector's input candidates with ``selected`` set by the device; leave it as
        :meth:`apply` would have (probabilities), so a device step reports what a CPU step reports."""

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
        fields = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({fields})"

    def params(self) -> dict:
        """The sampler's parameters by name (what its ``repr`` shows and a trace records); none by default."""
        return {}


class Watched:
    """Mixin of the samplers whose parameters chain.py's fused step caches: every assignment bumps ``changes``."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        changes[0] += 1
