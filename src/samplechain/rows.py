"""``Rows``: the torch twin of ``Candidates``, many rows' candidates in a fixed-width ``[B, W]`` layout.

Each row is one llama.cpp candidate array. ``logits[B, W]`` (binary32) and ``ids[B, W]`` (None while position ==
token id) hold the entries; which entries are candidates is said in one of two forms:

- *prefix*: the row is sorted and its candidates are its first ``n[r]`` entries (``n`` None: all ``W``); the
  entries past ``n`` keep stale values, so truncating costs nothing;
- *mask*: ``live[B, W]`` (None: all); a removed entry keeps its slot with a ``-inf`` logit.

A row's candidate array is its candidates in order, exactly the array the CPU chain holds. Every decision a device
form makes in floating point where the CPU rounds differently carries an error bound; a row whose decision falls
inside it is *flagged* and redone on the CPU from its logits, so the device never selects a token the CPU chain
would not. Nothing here reads device values on the host: a step is a fixed sequence of tensor operations.

Torch is imported only by this module and the layers above it (the samplers import it inside their device forms).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

F32 = torch.float32
F64 = torch.float64
I64 = torch.int64
NEG_INF = float("-inf")
ULP32 = 2.0**-24  # unit roundoff of binary32
FLT_MAX = float(torch.finfo(F32).max)

# Wide rows are also viewed as [B, n_blocks, BLOCK] blocks of consecutive logits; the block maxima (one pass,
# shared with the NaN check) let top-k search a few blocks instead of the whole row.
BLOCK = 64
SUB_BLOCK = 16
WIDE = 4096


class Rows:
    """A batch of candidate rows on one device (see the module docstring).

    ``cache`` is the group's store of per-row parameter tensors and constants, kept across steps while the batch
    composition is unchanged; ``inputs`` holds this step's host inputs per sampler slot.
    """

    def __init__(self, logits: torch.Tensor, cache: dict, inputs: dict,
                 block_max: torch.Tensor | None = None) -> None:
        self.logits = logits  # [B, W] float32
        self.block_max = block_max  # [B, W // BLOCK] maxima of logits[:, :W // BLOCK * BLOCK], while valid
        self.ids: torch.Tensor | None = None
        self.live: torch.Tensor | None = None
        self.n: torch.Tensor | None = None
        self.sorted = False
        self.n_vocab = logits.shape[1]
        self.selected: torch.Tensor | None = None  # [B, 1] positions
        self.flags: list[torch.Tensor] = []
        self.draws: list[tuple[int, torch.Tensor]] = []  # (slot, [B, 1] whether the row used its draw)
        self.slot = 0  # position of the sampler being applied in the prefix
        self._cache = cache
        self._inputs = inputs
        self._first: torch.Tensor | None = None
        self._last: torch.Tensor | None = None

    # --- shape ---------------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.logits.device

    @property
    def batch(self) -> int:
        return self.logits.shape[0]

    @property
    def width(self) -> int:
        return self.logits.shape[1]

    @property
    def identity(self) -> bool:
        return self.ids is None

    def arange(self, n: int | None = None) -> torch.Tensor:
        """``[n]`` 0..n-1 (n defaults to the width), made once per batch composition."""
        n = self.width if n is None else n
        return self.constant(("arange", n), lambda: torch.arange(n, device=self.device), shared=True)

    def positions_to_ids(self, pos: torch.Tensor) -> torch.Tensor:
        return pos if self.ids is None else self.ids.gather(1, pos)

    # --- parameters and inputs -----------------------------------------------------------------------------

    def constant(self, key: object, make: Callable[[], object], shared: bool = False) -> object:
        """``make()`` once per batch composition (per sampler slot unless ``shared``), then the cached value."""
        k = key if shared else (self.slot, key)
        v = self._cache.get(k)
        if v is None:
            v = self._cache[k] = make()
        return v

    def param(self, members: Sequence[object], attr: str, dtype: torch.dtype = F32) -> torch.Tensor:
        """``[B, 1]`` tensor of ``getattr(member, attr)`` per row, uploaded once per batch composition."""
        return self.constant(attr, lambda: torch.tensor([[float(getattr(m, attr))] for m in members],
                                                        dtype=dtype, device=self.device))

    def step_input(self) -> object:
        """This step's host inputs for the current sampler: a ``[B, c]`` float64 tensor (already on the device)
        when the sampler's ``device_input`` gives numbers, else the list of its rows' inputs."""
        return self._inputs[self.slot]

    # --- reading -------------------------------------------------------------------------------------------

    def count(self) -> torch.Tensor:
        """``[B, 1]`` number of candidates per row."""
        if self.n is not None:
            return self.n
        if self.live is not None:
            return self.live.sum(1, keepdim=True)
        return self.constant(("width", self.width), lambda: torch.full((self.batch, 1), self.width, dtype=I64,
                                                                      device=self.device), shared=True)

    def mask(self) -> torch.Tensor | None:
        """``[B, W]`` which entries are candidates, None when all are."""
        if self.n is not None:
            return self.arange() < self.n
        return self.live

    def first(self) -> torch.Tensor:
        """``[B, 1]`` the first entry's logit (the largest, in a sorted row)."""
        if self._first is None:
            self._first = self.logits[:, :1]
        return self._first

    def at_last(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, 1]`` the entry of ``t[B, W]`` at each row's last candidate (prefix form) or last column."""
        if self.n is None:
            return t[:, -1:]
        if self._last is None:
            self._last = self.n - 1
        return t.gather(1, self._last)

    def row_max(self) -> torch.Tensor:
        """``[B, 1]`` largest logit (removed entries are -inf, so the largest candidate logit)."""
        if self.sorted:
            return self.first()
        return self.logits.amax(1, keepdim=True)

    def first_max(self) -> torch.Tensor:
        """``[B, 1]`` position of the first largest candidate logit (the first candidate when all are -inf)."""
        if self.sorted:
            return self.constant(("zeros", self.batch), lambda: torch.zeros(self.batch, 1, dtype=I64,
                                                                          device=self.device), shared=True)
        pos = self.logits.argmax(1, keepdim=True)  # torch returns the first maximal index
        if self.live is not None:
            all_masked = self.logits.gather(1, pos) == NEG_INF
            pos = torch.where(all_masked, self.live.to(torch.uint8).argmax(1, keepdim=True), pos)
        return pos

    def exp_rel(self, m: torch.Tensor | None = None) -> torch.Tensor:
        """``expf(logit - m)`` per entry (binary32, from the binary64 exponential), m the row maximum."""
        if m is None:
            m = self.row_max()
        m = torch.where(m == NEG_INF, 0.0, m)
        return torch.exp((self.logits - m).to(F64)).to(F32)

    def exp_rel_fast(self, m: torch.Tensor) -> torch.Tensor:
        """``exp(logit - m)`` in binary32 with torch's exponential (within two ulps of expf)."""
        return torch.exp(self.logits - torch.where(m == NEG_INF, 0.0, m))

    def zero_dead(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with the entries that are not candidates set to 0."""
        mask = self.mask()
        return t if mask is None else t.masked_fill(~mask, 0.0)

    def flag(self, cond: torch.Tensor) -> None:
        """Rows where ``cond`` ([B] or [B, c], bool or counts; any nonzero entry) are redone on the CPU."""
        self.flags.append(cond if cond.dim() == 2 else cond[:, None])

    def drew(self, used: torch.Tensor) -> None:
        """The current sampler's host draw was used only by the rows where ``used`` ([B, 1]); the others' generators
        are taken back one draw after the step (the CPU chain draws only when it needs to)."""
        self.draws.append((self.slot, used))

    def unsure(self) -> torch.Tensor:
        """``[B, 1]`` the rows to redo on the CPU."""
        if not self.flags:
            return self.constant(("false", self.batch), lambda: torch.zeros(self.batch, 1, dtype=torch.bool,
                                                                          device=self.device), shared=True)
        flags = self.flags[0] if len(self.flags) == 1 else torch.cat(self.flags, 1)
        return flags.any(1, keepdim=True)

    # --- writing -------------------------------------------------------------------------------------------

    def set_logits(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.block_max = None
        self._first = None

    def keep_first(self, n: torch.Tensor) -> None:
        """Keep the first ``n[r]`` candidates of each row (``n`` is ``[B, 1]``)."""
        if self.sorted:
            self.n = n
            self._last = None
        else:
            self.remove(self.arange() >= n if self.live is None else self.live.cumsum(1) > n)

    def remove(self, drop: torch.Tensor) -> None:
        """Remove the entries where ``drop`` (their order is kept; sortedness too)."""
        self.to_mask()
        self.set_logits(self.logits.masked_fill(drop, NEG_INF))
        keep = ~drop
        self.live = keep if self.live is None else self.live & keep

    def to_mask(self) -> None:
        """Prefix form to mask form, which is never marked sorted (before a sampler that may reorder)."""
        if self.n is not None:
            self.live = self.arange() < self.n
            self.set_logits(self.logits.masked_fill(~self.live, NEG_INF))
            self.n = None
            self._last = None
        self.sorted = False

    def take(self, pos: torch.Tensor, values: torch.Tensor | None = None) -> None:
        """New rows made of the entries at ``pos[B, K]``, in that order (``values``: their logits, if known).
        The rows are in prefix form afterwards only if nothing was removed before (callers set ``n``)."""
        self.ids = pos if self.ids is None else self.ids.gather(1, pos)
        self.set_logits(self.logits.gather(1, pos) if values is None else values)
        if self.live is not None:
            self.live = self.live.gather(1, pos)

    def narrow(self, k: int) -> None:
        """Keep the first ``k`` columns (sorted prefix rows)."""
        if k < self.width:
            self.ids = (self.arange(k).expand(self.batch, k) if self.ids is None else self.ids[:, :k])
            self.set_logits(self.logits[:, :k])
            if self.n is not None:
                self.n = self.n.clamp(max=k)
                self._last = None

    def sort(self) -> None:
        """llama.cpp's sort: descending logit, ties by current position (stable), into prefix form."""
        if self.sorted:
            return
        order = self.logits.sort(dim=1, descending=True, stable=True).indices
        n = None
        if self.live is not None:
            dead_last = (~self.live.gather(1, order)).to(torch.uint8).sort(dim=1, stable=True).indices
            order = order.gather(1, dead_last)
            n = self.live.sum(1, keepdim=True)
        self.take(order)
        self.live = None
        self.n = n
        self._last = None
        self.sorted = True

    def select(self, pos: torch.Tensor) -> None:
        """The selected position of each row (``[B, 1]``)."""
        self.selected = pos


def seq_sum_f32(t: torch.Tensor) -> torch.Tensor:
    """``[B, 1]`` left-to-right binary32 sums of the rows of ``t`` (exact, for narrow rows)."""
    s = torch.zeros(t.shape[0], dtype=F32, device=t.device)
    for j in range(t.shape[1]):
        s = s + t[:, j]
    return s[:, None]


def seq_cumsum_f32(t: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` left-to-right binary32 running sums of the rows of ``t`` (exact, for narrow rows)."""
    s = torch.zeros(t.shape[0], dtype=F32, device=t.device)
    out = []
    for j in range(t.shape[1]):
        s = s + t[:, j]
        out.append(s)
    return torch.stack(out, 1)


def near(values: torch.Tensor, target: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """``[B]``: does any entry of ``values`` lie within ``margin`` of ``target`` (row-wise)?"""
    return ((values - target).abs() <= margin).any(1)


def block_max(x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Maxima of the blocks of ``BLOCK`` consecutive logits of wide rows (None for narrow rows) and the ``[B, 1]``
    row maxima, in one pass; NaN propagates into both."""
    b, w = x.shape
    if w < WIDE:
        return None, x.amax(1, keepdim=True)
    nb = w // BLOCK
    bm = (x if nb * BLOCK == w else x[:, : nb * BLOCK]).view(b, nb, BLOCK).amax(2)
    row_max = bm.amax(1, keepdim=True)
    if nb * BLOCK < w:
        row_max = torch.maximum(row_max, x[:, nb * BLOCK :].amax(1, keepdim=True))
    return bm, row_max


def top_candidates(rows: Rows, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``[B, kk]`` (descending) and positions of the ``kk`` largest logits of each row; equal values come
    in no particular order (callers flag rows with equal neighbours). ``kk <= width``.

    Wide rows are searched sort-free in two levels: every entry above the kk-th largest block maximum lies in
    one of the kk blocks with the largest maxima, and within those, every entry above the kk-th largest
    sub-block maximum lies in one of the kk sub-blocks with the largest maxima. The kk values found are the
    row's kk largest; only which of several equal values is found can differ (equal neighbours).
    """
    x = rows.logits
    b, w = x.shape
    nb = w // BLOCK
    if w < WIDE or kk * 4 > nb:
        return x.topk(kk, dim=1)
    bm = rows.block_max
    if bm is None:
        bm = (x if nb * BLOCK == w else x[:, : nb * BLOCK]).view(b, nb, BLOCK).amax(2)
    blocks = bm.topk(kk, dim=1, sorted=False).indices  # [B, kk]
    pos = torch.add(_tile(rows, kk, BLOCK), blocks.repeat_interleave(BLOCK, dim=1), alpha=BLOCK)  # [B, kk*BLOCK]
    vals = x.gather(1, pos)
    sub = vals.view(b, -1, SUB_BLOCK).amax(2).topk(kk, dim=1, sorted=False).indices  # [B, kk] of kk*BLOCK/SUB
    at = torch.add(_tile(rows, kk, SUB_BLOCK), sub.repeat_interleave(SUB_BLOCK, dim=1), alpha=SUB_BLOCK)
    pos, vals = pos.gather(1, at), vals.gather(1, at)  # [B, kk*SUB_BLOCK]
    if nb * BLOCK < w:  # the short tail past the blocks is searched in full
        vals = torch.cat((vals, x[:, nb * BLOCK :]), 1)
        pos = torch.cat((pos, rows.arange(w)[nb * BLOCK :].expand(b, -1)), 1)
    v, j = vals.topk(kk, dim=1)
    return v, pos.gather(1, j)


def _tile(rows: Rows, kk: int, size: int) -> torch.Tensor:
    """``[kk * size]``: 0..size-1 repeated kk times (the offsets inside kk blocks of ``size``)."""
    return rows.constant(("tile", kk, size), lambda: rows.arange(size).repeat(kk), shared=True)


def stable_order(values: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` (descending, ties in any order) and ``pos`` reordered so equal values are by position."""
    pos, by_pos = pos.sort(dim=1)
    values, by_value = values.gather(1, by_pos).sort(dim=1, descending=True, stable=True)
    return values, pos.gather(1, by_value)
