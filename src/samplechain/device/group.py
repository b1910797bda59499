"""A ``BatchSampler`` group: rows whose device prefixes share a shape run one program, with its static input
buffer and its block of the step's transfer; apart from ``batch.py``, which plans and reads back the steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from samplechain.device.protocol import RowSampler
from samplechain.rows import Rows
from samplechain.samplers.base import DEVICE_SMALL_WIDTH, SELECTOR, DeviceShape, Sampler

F64 = torch.float64


def _has_input(s: Sampler) -> bool:
    return type(s).device_input is not Sampler.device_input


def _numbers(value: object) -> bool:
    """A ``device_input`` that goes into the step's static buffer: a tuple of floats."""
    return isinstance(value, tuple) and all(isinstance(v, float) for v in value)


@dataclass
class BatchRow:
    """One row of a ``BatchSampler``: its samplers, how many of them run on the device, and its prefix's shape."""

    owner: RowSampler
    samplers: list[Sampler]
    prefix: int  # samplers[:prefix] run on the device (disabled ones are skipped)
    key: tuple
    cpu_only: bool
    seeded: list[Sampler] = field(default_factory=list)  # samplers with their own generator


@dataclass
class _Layout:
    """Where a group's results sit in its ``[Bg, C]`` block of the step's transfer (fixed per composition)."""

    selecting: bool
    draws: list[int]  # slots whose draw a row may not have used (one column each)
    form: str | None  # candidates sent back: None, "all", "n" (prefix count) or "live" (mask)
    identity: bool
    width: int
    sorted: bool


class BatchGroup:
    """Rows whose device prefixes have the same shape: one program, per-row parameters, a static input buffer."""

    def __init__(self, rows: list[int], members: list[list[Sampler]], index: torch.Tensor | None,
                 records: bool) -> None:
        self.rows = rows
        self.members = members  # per device slot: that slot's sampler of every row
        self.index = index  # rows of the batch, None when the group is the whole batch in order
        self.records = records  # some row keeps the step's candidates (CommonSampler)
        self.cache: dict = {}  # per-row parameter tensors and constants (Rows.constant)
        self.input_slots = [slot for slot, m in enumerate(members) if _has_input(m[0])]
        self.widths: dict[int, int] = {}  # slots whose inputs are numbers: how many per row
        self.host: dict[int, np.ndarray] | None = None  # per slot [Bg, width] float64 views, written each step
        self.dev: torch.Tensor | None = None  # the same numbers on the device (the same memory on the CPU)
        self.views: dict[int, torch.Tensor] = {}
        self.layout: _Layout | None = None
        self.last: Rows | None = None  # this step's rows (eager steps), for candidates read lazily

    def stage(self, device: torch.device, n_slots: int | None = None) -> dict:
        """Draw this step's host inputs (of the first ``n_slots`` slots); numbers go into the static buffer (one
        upload), anything else (history tables) is handed over as a list."""
        drawn = {slot: [s.device_input() for s in self.members[slot]] for slot in self.input_slots
                 if n_slots is None or slot < n_slots}
        new = {slot: len(v[0]) for slot, v in drawn.items() if slot not in self.widths and _numbers(v[0])}
        if new or self.host is None:
            self.widths.update(new)
            self._allocate(device)
        inputs: dict = {}
        for slot, vals in drawn.items():
            if slot in self.widths:
                self.host[slot][:] = vals
                inputs[slot] = self.views[slot]
            else:
                inputs[slot] = vals
        if self.widths and self.dev.device.type != "cpu":
            self.dev.copy_(self._pinned, non_blocking=True)
        return inputs

    def _allocate(self, device: torch.device) -> None:
        """One float64 buffer for every numeric input of the group: a contiguous ``[Bg, width]`` block per slot."""
        b = len(self.rows)
        size = b * sum(self.widths.values())
        if device.type == "cpu":
            self.dev = self._pinned = torch.zeros(max(size, 1), dtype=F64)
        else:
            self._pinned = torch.zeros(max(size, 1), dtype=F64, pin_memory=True)
            self.dev = torch.zeros(max(size, 1), dtype=F64, device=device)
        flat = self._pinned.numpy()
        self.host, self.views, start = {}, {}, 0
        for slot, w in sorted(self.widths.items()):
            self.host[slot] = flat[start : start + b * w].reshape(b, w)
            self.views[slot] = self.dev[start : start + b * w].view(b, w)
            start += b * w

    def run(self, x: torch.Tensor, bm: torch.Tensor | None, inputs: dict, n_slots: int | None = None) -> Rows:
        """The device prefix (its first ``n_slots`` samplers) of the group's rows of ``x``."""
        if self.index is not None:
            x = x.index_select(0, self.index)
            bm = None if bm is None else bm.index_select(0, self.index)
        rows = Rows(x, self.cache, inputs, bm)
        for slot, members in enumerate(self.members[:n_slots]):
            rows.slot = slot
            members[0].device_apply(rows, members)
        return rows

    def pack(self, rows: Rows) -> list[torch.Tensor]:
        """The ``[Bg, c]`` columns of the group's results: the token (or -1: redo) or the redo mark, the draw
        flags, the candidates (one float32 block once concatenated)."""
        unsure = rows.unsure()
        if rows.selected is not None:
            cols = [rows.positions_to_ids(rows.selected).masked_fill(unsure, -1)]
        else:
            cols = [unsure]
        cols += [used for _, used in rows.draws]
        form = None
        if rows.selected is None or (self.records and rows.width <= DEVICE_SMALL_WIDTH):
            form = "n" if rows.n is not None else "live" if rows.live is not None else "all"
            cols += [t for t in (rows.n, rows.live, rows.ids) if t is not None] + [rows.logits]
        self.layout = _Layout(rows.selected is not None, [slot for slot, _ in rows.draws], form, rows.ids is None,
                              rows.width, rows.sorted)
        return cols


def plan_prefix(samplers: Sequence[Sampler], select_on_device: bool = True) -> tuple[int, tuple]:
    """``(n, key)``: the first ``n`` samplers form the device prefix; ``key`` groups compatible prefixes."""
    shape = DeviceShape()
    key: list[tuple] = []
    n = 0
    for s in samplers:
        if not s.disabled:
            if shape.selected or (s.effect == SELECTOR and not select_on_device):
                break
            nxt = s.device_plan(shape)
            if nxt is None:
                break
            shape = nxt
            key.append((type(s), s.device_key()))
        n += 1
    return n, tuple(key)

