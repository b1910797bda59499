"""``BatchSampler``: one chain per row, the leading device-capable samplers of every chain run batched on torch.

A row's *device prefix* is the longest leading run of its chain's samplers whose device form handles the row's
shape at that point (:meth:`Sampler.device_plan`). Rows whose prefixes have the same key (sampler types and
static choices) form one group and run together, each sampler once for the whole group with per-row parameter
tensors. Each step then makes one transfer to the host: the selected token ids of groups whose prefix selects,
or the reduced candidates (ids, logits) of the others, which the CPU rest of their chains finishes.

Random numbers come from each row's own llama.cpp-exact generators, drawn on the host before the step, so a
row's token never depends on its batch-mates. A row whose device decision lies within floating-point reach of
a different outcome (see :mod:`samplechain.device.rows`) is redone on the CPU from its logits with its
generators rewound: the token is always the one the row's CPU chain selects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.device.rows import Rows, column_max
from samplechain.params import CommonSampler
from samplechain.samplers.base import SELECTOR, DeviceShape, Sampler


def _has_input(s: Sampler) -> bool:
    return type(s).device_input is not Sampler.device_input


@dataclass
class _Row:
    owner: Chain | CommonSampler
    samplers: list[Sampler]
    prefix: int  # samplers[:prefix] run on the device (disabled ones are skipped)
    key: tuple
    seeded: list[Sampler] = field(default_factory=list)  # samplers with their own generator

    @property
    def cpu_only(self) -> bool:
        """A grammar or a reasoning budget: the row's whole step runs through ``CommonSampler.sample``."""
        return isinstance(self.owner, CommonSampler) and (self.owner.grammar is not None
                                                          or self.owner.reasoning_budget is not None)


@dataclass
class _Group:
    rows: list[int]
    members: list[list[Sampler]]  # per device slot: that slot's sampler of every row
    index: torch.Tensor | None  # rows of the batch, None when the group is the whole batch in order
    params: dict = field(default_factory=dict)


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


class BatchSampler:
    """Sample one token per row of a ``[B, n_vocab]`` logits tensor, row i with ``chains[i]``.

    ``chains`` holds one :class:`Chain` or :class:`CommonSampler` per row (distinct objects: each keeps its own
    state). ``select_on_device=False`` stops every device prefix before its selector (llama.cpp's hybrid mode:
    filtering on the device, the draw on the CPU over the reduced candidates). A CommonSampler with a grammar
    samples on the CPU (llama.cpp turns backend sampling off for grammars).
    """

    def __init__(self, chains: Sequence[Chain | CommonSampler], device: str | torch.device = "cpu", *,
                 select_on_device: bool = True) -> None:
        if isinstance(chains, (Chain, CommonSampler)) or not isinstance(chains, Sequence):
            raise ValueError("chains must be a sequence with one Chain or CommonSampler per row")
        if not chains:
            raise ValueError("chains must not be empty")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"unknown device {device!r}") from e
        self.select_on_device = select_on_device
        seen: set[int] = set()
        self._rows: list[_Row] = []
        for i, owner in enumerate(chains):
            if isinstance(owner, CommonSampler):
                samplers = owner.chain.samplers
            elif isinstance(owner, Chain):
                samplers = owner.samplers
            else:
                raise ValueError(f"chains[{i}] must be a Chain or CommonSampler, got {type(owner).__name__}")
            if id(owner) in seen:
                raise ValueError(f"chains[{i}] appears twice; every row needs its own chain (clone() it)")
            seen.add(id(owner))
            row = _Row(owner, list(samplers), 0, ())
            if not row.cpu_only:
                row.prefix, row.key = plan_prefix(row.samplers, select_on_device)
            row.seeded = [s for s in row.samplers if hasattr(s, "rng")]
            self._rows.append(row)
        by_key: dict[tuple, list[int]] = {}
        for i, row in enumerate(self._rows):
            if row.key:
                by_key.setdefault(row.key, []).append(i)
        self._groups: list[_Group] = []
        for idx in by_key.values():
            members = [[s for s in self._rows[i].samplers[: self._rows[i].prefix] if not s.disabled] for i in idx]
            whole = idx == list(range(len(self._rows)))
            index = None if whole else torch.tensor(idx, dtype=torch.int64, device=self.device)
            self._groups.append(_Group(idx, [list(slot) for slot in zip(*members, strict=True)], index))
        self._cpu_rows = [i for i, row in enumerate(self._rows) if not row.key]

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def prefix_lengths(self) -> list[int]:
        """How many leading samplers of each row's chain run on the device."""
        return [row.prefix for row in self._rows]

    @property
    def n_groups(self) -> int:
        """How many device programs one step runs (rows with the same prefix shape share one)."""
        return len(self._groups)

    def describe(self, i: int) -> str:
        """Row ``i``'s chain with llama.cpp's marks: ``+name`` on the device, ``name`` on the CPU."""
        row = self._rows[i]
        names = [("+" if j < row.prefix and row.key else "") + s.display_name for j, s in enumerate(row.samplers)]
        return " -> ".join(["logits", *names])

    # --- sampling ------------------------------------------------------------------------------------------

    def sample(self, logits: torch.Tensor) -> list[int]:
        """One token per row (each accepted into its row's chain); ``logits`` is ``[B, n_vocab]`` on the device.

        Raises ``ValueError`` for a wrong shape, type or device, NaN or +inf logits, or a chain that selects
        nothing; the chains are then left exactly as they were.
        """
        x = self._check(logits)
        saved = [[(s, s.rng.mark()) for s in row.seeded] for row in self._rows]
        try:
            tokens, accepted = self._step(x, saved)
        except BaseException:
            for snap in saved:
                _restore(snap)
            raise
        for i, token in enumerate(tokens):
            if not accepted[i]:
                owner = self._rows[i].owner
                if isinstance(owner, CommonSampler):
                    owner.accept(token, is_generated=True)
                else:
                    owner.accept(token)
        return tokens

    def _check(self, logits: object) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor):
            raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.ndim != 2 or logits.shape[0] != len(self._rows) or logits.shape[1] == 0:
            raise ValueError(f"logits must have shape [{len(self._rows)}, n_vocab], got {list(logits.shape)}")
        if not logits.is_floating_point():
            raise ValueError(f"logits must be floating point, got {logits.dtype}")
        if logits.device.type != self.device.type or (
                self.device.index is not None and logits.device.index != self.device.index):
            raise ValueError(f"logits are on {logits.device}, the sampler on {self.device}")
        x = logits.detach()
        return x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()

    def _run(self, x: torch.Tensor) -> tuple[list[tuple[_Group, Rows]], torch.Tensor]:
        """Every group's device prefix on its rows of ``x``; also the row maxima (NaN/+inf check)."""
        pending: list[tuple[_Group, Rows]] = []
        col_max, row_max = column_max(x)
        for g in self._groups:
            step = {}
            for slot, members in enumerate(g.members):
                if _has_input(members[0]):
                    step[slot] = [s.device_input() for s in members]
            if g.index is None:
                rows = Rows(x, g.params, step, col_max)
            else:
                rows = Rows(x.index_select(0, g.index), g.params, step,
                            None if col_max is None else col_max.index_select(0, g.index))
            for slot, members in enumerate(g.members):
                rows.slot = slot
                members[0].device_apply(rows, members)
            pending.append((g, rows))
        return pending, row_max

    def _step(self, x: torch.Tensor, saved: list) -> tuple[list[int], list[bool]]:
        pending, row_max = self._run(x)
        # one transfer: row maxima (NaN/+inf check), then per group the tokens or the reduced candidates
        out: list[torch.Tensor | None] = [row_max]
        for _, rows in pending:
            if rows.selected is not None:
                out += [rows.positions_to_ids(rows.selected[:, None])[:, 0], rows.unsure]
            else:
                out += [rows.logits, rows.ids, rows.live, rows.unsure]
        if self._cpu_rows:
            out.append(x.index_select(0, torch.tensor(self._cpu_rows, device=x.device)))
        host = [None if t is None else t.cpu() for t in out]
        bad = (~(host[0] < float("inf"))).nonzero()
        if len(bad):
            raise ValueError(f"logits row {int(bad[0, 0])} contains NaN or +inf")

        n = len(self._rows)
        tokens: list[int] = [-1] * n
        accepted = [False] * n
        redo: list[int] = []
        k = 1
        for g, rows in pending:
            if rows.selected is not None:
                ids, unsure = host[k].numpy(), host[k + 1].numpy()
                k += 2
                for j, i in enumerate(g.rows):
                    if unsure[j]:
                        redo.append(i)
                    else:
                        tokens[i] = int(ids[j])
                continue
            lg, ids, live, unsure = (None if t is None else t.numpy() for t in host[k : k + 4])
            k += 4
            for j, i in enumerate(g.rows):
                if unsure[j]:
                    redo.append(i)
                    continue
                keep = slice(None) if live is None else live[j].nonzero()[0]
                row_ids = (np.arange(lg.shape[1], dtype=np.int32) if ids is None else ids[j].astype(np.int32))
                c = Candidates(row_ids[keep], lg[j][keep], sorted=rows.sorted)
                tokens[i] = self._finish(i, c)
        if self._cpu_rows:
            full = host[k].numpy()
            for j, i in enumerate(self._cpu_rows):
                tokens[i], accepted[i] = self._cpu(i, full[j])
        if redo:  # rare: a decision too close to call in the device arithmetic
            full = x.index_select(0, torch.tensor(redo, device=x.device)).cpu().numpy()
            for j, i in enumerate(redo):
                _restore(saved[i])
                tokens[i], accepted[i] = self._cpu(i, full[j])
        return tokens, accepted

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The device prefix of every row as a logits processor: ``[B, n_vocab]`` logits after the chains'
        filtering and transforming samplers, removed tokens at -inf. Nothing is drawn or accepted.

        Every sampler of every chain must be device-capable, but for a final dist or greedy (which is skipped).
        """
        for i, row in enumerate(self._rows):
            rest = [s for s in row.samplers[row.prefix :] if not s.disabled]
            if row.cpu_only or (rest and (len(rest) > 1 or rest[0].name not in ("dist", "greedy"))):
                raise ValueError(f"row {i}: {self.describe(i)} has samplers without a device form after the "
                                 "prefix; a logits processor cannot run them")
        x = self._check(logits)
        pending, row_max = self._run(x)
        out = torch.full_like(x, float("-inf"))
        redo: list[int] = []
        for g, rows in pending:
            vals = rows.logits if rows.live is None else rows.logits.masked_fill(~rows.live, float("-inf"))
            if not rows.identity:
                vals = torch.full((rows.batch, rows.n_vocab), float("-inf"), device=x.device).scatter_(
                    1, rows.ids, vals)
            idx = torch.tensor(g.rows, device=x.device)
            out.index_copy_(0, idx, vals)
            redo += [g.rows[j] for j in rows.unsure.nonzero()[:, 0].tolist()]
        for i in redo:  # rare: a decision too close to call in the device arithmetic
            c = Candidates.from_logits(x[i].cpu().numpy())
            for s in self._rows[i].samplers[: self._rows[i].prefix]:
                s.apply(c)
            row = torch.full((x.shape[1],), float("-inf"))
            row[torch.from_numpy(c.ids.astype(np.int64))] = torch.from_numpy(np.ascontiguousarray(c.logits))
            out[i] = row.to(x.device)
        if not bool((row_max < float("inf")).all()):
            raise ValueError("logits contain NaN or +inf")
        return out

    def _finish(self, i: int, c: Candidates) -> int:
        """The CPU rest of row ``i``'s chain on its reduced candidates."""
        for s in self._rows[i].samplers[self._rows[i].prefix :]:
            s.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"row {i}: no sampler selected a token ({self.describe(i)})")
        return int(c.ids[c.selected])

    def _cpu(self, i: int, logits: np.ndarray) -> tuple[int, bool]:
        """Row ``i`` entirely on the CPU; returns the token and whether it was already accepted."""
        owner = self._rows[i].owner
        if self._rows[i].cpu_only:
            return owner.sample(logits), True
        c = Candidates.from_logits(logits)
        for s in self._rows[i].samplers:
            s.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"row {i}: no sampler selected a token ({self.describe(i)})")
        return int(c.ids[c.selected]), False


def _restore(snapshot: list) -> None:
    for s, mark in snapshot:
        s.rng.rewind(mark)
