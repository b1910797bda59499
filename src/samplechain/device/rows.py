"""``Rows``: the candidates of a batch of rows on a torch device, and the exact primitives device forms use.

One ``Rows`` holds the rows whose chains share a device prefix shape. Each row is one llama.cpp candidate
array laid out in a fixed-width tensor: ``logits[B, W]`` (binary32), ``ids[B, W]`` (None while position == id),
``live[B, W]`` (None while every entry is a candidate). Removed candidates keep their slot with a ``-inf`` logit
and ``live == False``, so a row's candidate array is its live entries in order, exactly the array the CPU chain
holds. Every decision a device form makes in floating point that the CPU makes with a different rounding order
carries an error bound; a row whose decision falls inside its bound is marked ``unsure`` and is redone on the
CPU from its logits, so the device never selects a token the CPU chain would not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

F32 = torch.float32
F64 = torch.float64
NEG_INF = float("-inf")
ULP32 = 2.0**-24  # unit roundoff of binary32



class Rows:
    """A batch of candidate rows on one device (see the module docstring)."""

    def __init__(self, logits: torch.Tensor, params: dict, step: dict,
                 col_max: torch.Tensor | None = None) -> None:
        self.logits = logits
        self.col_max = col_max  # maxima of the columns of logits[:, :64*cols].view(B, 64, cols), while valid
        self.ids: torch.Tensor | None = None
        self.live: torch.Tensor | None = None
        self.sorted = False
        self.n_vocab = logits.shape[1]
        self.unsure = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        self.selected: torch.Tensor | None = None  # [B] positions
        self.slot = 0  # position of the sampler being applied in the prefix
        self._params = params  # (slot, attribute) -> [B, 1] tensor, kept by the group across steps
        self._step = step  # slot -> per-step host inputs already on the device

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
        return torch.arange(self.width if n is None else n, device=self.device)

    def positions_to_ids(self, pos: torch.Tensor) -> torch.Tensor:
        return pos if self.ids is None else self.ids.gather(1, pos)

    # --- parameters ----------------------------------------------------------------------------------------

    def param(self, members: Sequence[object], attr: str, dtype: torch.dtype = F32) -> torch.Tensor:
        """``[B, 1]`` tensor of ``getattr(member, attr)`` per row, uploaded once per group."""
        key = (self.slot, attr)
        t = self._params.get(key)
        if t is None:
            t = torch.tensor([[float(getattr(m, attr))] for m in members], dtype=dtype, device=self.device)
            self._params[key] = t
        return t

    def step_input(self) -> object:
        """This step's host inputs for the current sampler (uniforms, penalty tables), already uploaded."""
        return self._step[self.slot]

    # --- reading -------------------------------------------------------------------------------------------

    def count(self) -> torch.Tensor:
        """``[B, 1]`` number of live candidates per row."""
        if self.live is None:
            return torch.full((self.batch, 1), self.width, device=self.device, dtype=torch.int64)
        return self.live.sum(1, keepdim=True)

    def row_max(self) -> torch.Tensor:
        """``[B, 1]`` largest logit (removed entries are -inf, so this is the largest live logit)."""
        return self.logits.amax(1, keepdim=True)

    def first_max(self) -> torch.Tensor:
        """``[B]`` position of the first largest live logit (the first live entry when all are -inf)."""
        pos = self.logits.argmax(1)  # torch returns the first maximal index
        if self.live is not None:
            all_masked = self.logits.gather(1, pos[:, None])[:, 0] == NEG_INF
            pos = torch.where(all_masked, self.live.to(torch.uint8).argmax(1), pos)
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

    # --- writing -------------------------------------------------------------------------------------------

    def set_logits(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.col_max = None

    def remove(self, drop: torch.Tensor) -> None:
        """Remove the entries where ``drop`` (their order is kept; sortedness too)."""
        self.set_logits(self.logits.masked_fill(drop, NEG_INF))
        keep = ~drop
        self.live = keep if self.live is None else self.live & keep

    def keep_first(self, n: torch.Tensor) -> None:
        """Keep the first ``n[r]`` entries of each row (``n`` is ``[B, 1]``)."""
        self.remove(self.arange()[None, :] >= n)

    def gather(self, pos: torch.Tensor) -> None:
        """New rows made of the entries at ``pos[B, K]``, in that order."""
        self.ids = pos if self.ids is None else self.ids.gather(1, pos)
        self.set_logits(self.logits.gather(1, pos))
        if self.live is not None:
            self.live = self.live.gather(1, pos)

    def sort(self) -> None:
        """llama.cpp's sort: descending logit, ties by current position (stable); live entries first."""
        if self.sorted:
            return
        order = self.logits.sort(dim=1, descending=True, stable=True).indices
        if self.live is not None:
            dead_first = (~self.live.gather(1, order)).to(torch.uint8).sort(dim=1, stable=True).indices
            order = order.gather(1, dead_first)
        self.gather(order)
        self.sorted = True

    def flag(self, cond: torch.Tensor) -> None:
        """Rows where ``cond`` ([B] or [B, 1]) are redone on the CPU."""
        self.unsure |= cond.reshape(-1)

    def select(self, pos: torch.Tensor) -> None:
        self.selected = pos


def seq_sum_f32(t: torch.Tensor) -> torch.Tensor:
    """``[B, 1]`` left-to-right binary32 sums of the rows of ``t`` (exact, for narrow rows)."""
    s = torch.zeros(t.shape[0], dtype=F32, device=t.device)
    for j in range(t.shape[1]):
        s = s + t[:, j]
    return s[:, None]


def near(values: torch.Tensor, target: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """``[B]``: does any entry of ``values`` lie within ``margin`` of ``target`` (row-wise)?"""
    return ((values - target).abs() <= margin).any(1)


def top_sorted(rows: Rows, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and positions of the ``k + 1`` largest logits of each row (all if narrower), in llama.cpp's
    order: descending, equal values by position. Sort-free on wide rows.

    Wide rows are viewed as ``[64, cols]`` blocks: every entry strictly above the (k+1)-th value lies in one of
    the k+1 columns with the largest maxima, so only those columns (and the short tail) are searched.
    Callers check the boundary ``values[k-1] == values[k]`` themselves (ties across the cut).
    """
    x = rows.logits
    b, w = x.shape
    kk = min(k + 1, w)
    cols = w // 64
    if w >= 4096 and kk * 4 <= cols:
        grid = x[:, : 64 * cols].reshape(b, 64, cols)
        cidx = (grid.amax(1) if rows.col_max is None else rows.col_max).topk(kk, dim=1).indices  # [B, kk]
        vals = grid.gather(2, cidx[:, None, :].expand(b, 64, kk)).reshape(b, -1)
        pos = (torch.arange(64, device=x.device)[None, :, None] * cols + cidx[:, None, :]).reshape(b, -1)
        if 64 * cols < w:
            vals = torch.cat((vals, x[:, 64 * cols :]), 1)
            pos = torch.cat((pos, torch.arange(64 * cols, w, device=x.device).expand(b, -1)), 1)
        v, j = vals.topk(kk, dim=1)
        p = pos.gather(1, j)
    else:
        v, p = x.topk(kk, dim=1)
    p, perm = p.sort(dim=1)
    v = v.gather(1, perm)
    v, perm = v.sort(dim=1, descending=True, stable=True)
    return v, p.gather(1, perm)


def column_max(x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Column maxima of wide rows viewed as ``[64, cols]`` blocks (None for narrow rows) and the row maxima,
    in one pass; NaN propagates into both."""
    b, w = x.shape
    cols = w // 64
    if w < 4096:
        return None, x.amax(1)
    col_max = x[:, : 64 * cols].reshape(b, 64, cols).amax(1)
    row_max = col_max.amax(1)
    if 64 * cols < w:
        row_max = torch.maximum(row_max, x[:, 64 * cols :].amax(1))
    return col_max, row_max
