"""Samplers that remove or mask candidates: top-k, top-n-sigma and XTC here; top-p, min-p and typical (the
probability filters) in ``probability_filters.py``, importable from here too (llama.cpp: each
sampler's ``llama_sampler_<name>_apply`` in src/llama-sampler.cpp)."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import F32, F64, NEG_INF, seq_sum_f32
from samplechain.candidates import Candidates
from samplechain.rng import DEFAULT_SEED
from samplechain.samplers._ops import apply_top_k, softmax
from samplechain.samplers.base import DEVICE_SMALL_WIDTH, FILTER, DeviceShape, Sampler, Watched
from samplechain.samplers.probability_filters import (  # noqa: F401  (the truncation samplers, importable from here)
    MinP,
    TopP,
    Typical,
    min_p_descending_size,
    min_p_sorted_size,
    nucleus_size,
    nucleus_size_from_sums,
)
from samplechain.samplers.selectors import SeededSampler
from samplechain.validate import check_int, check_number


class TopK(Watched, Sampler):
    """Keeps the ``k`` largest logits, sorted descending; ``k <= 0`` is a no-op."""

    name = "top-k"
    effect = FILTER

    def __init__(self, k: int) -> None:
        self.k = check_int("top_k", k)
        self.disabled = self.k <= 0

    def params(self) -> dict:
        return {"k": self.k}

    def apply(self, c: Candidates) -> None:
        if not self.disabled and len(c):
            apply_top_k(c, self.k)

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected:
            return None
        width = self.k if shape.width is None else min(self.k, shape.width)
        return shape.but(width=width, identity=False, sorted=True)

    def device_apply(self, rows, members) -> None:
        """Sorted rows are truncated. Narrow rows, and rows no wider than k, are sorted (stably: llama.cpp's order).
        Otherwise the k + 1 largest values are found sort-free (:func:`top_candidates`): their order is
        llama.cpp's unless two of them are equal, and a row with equal neighbours among them (a tie within the
        top k or across the cut, -inf ties included) is redone on the CPU."""
        from samplechain.rows import top_candidates

        k_width = rows.constant(("k", rows.width), lambda: _row_limits(rows, [m.k for m in members]))
        width, k = k_width
        if rows.sorted:
            if k is not None:
                rows.keep_first(rows.count().minimum(k))
            rows.narrow(width)
            return
        if rows.width <= DEVICE_SMALL_WIDTH or width == rows.width:
            rows.sort()
            rows.narrow(width)
        else:
            v, pos = top_candidates(rows, width + 1)
            rows.flag(v.diff(dim=1) == 0)
            rows.take(pos[:, :width], v[:, :width])
            rows.live = None  # the rows kept are finite, hence candidates, unless flagged
            rows.sorted = True
        if k is not None:
            rows.keep_first(rows.count().minimum(k))



def _row_limits(rows, ks: list[int]) -> tuple:
    """``(width, k)``: the group's widest k (at most the row width), and per-row ``[B, 1]`` limits when some row
    keeps fewer (None when every row keeps ``width``)."""
    import torch

    width = min(max(ks), rows.width)
    if min(ks) >= width:
        return width, None
    return width, torch.tensor([[min(k, width)] for k in ks], dtype=torch.int64, device=rows.device)

class TopNSigma(Sampler):
    """Masks logits more than ``n`` standard deviations below the maximum (over finite logits)."""

    name = "top-n-sigma"
    effect = FILTER

    def __init__(self, n: float) -> None:
        self.n = F32(check_number("top_n_sigma", n))
        self.disabled = bool(self.n <= 0.0)

    def params(self) -> dict:
        return {"n": float(self.n)}

    def apply(self, c: Candidates) -> None:
        if self.disabled or len(c) <= 1:
            return
        x = c.logits
        finite = x[x != -np.inf]
        count = len(finite)
        if count == 0:
            return
        mx = finite.max()
        mean = seq_sum_f32(finite) / F32(count)
        dev = finite - mean
        var = seq_sum_f32((dev.astype(F64) ** 2).astype(F32))
        std = F32(np.sqrt(var / F32(count)))
        thr = mx - self.n * std
        masked = x < thr
        if masked.any():
            c.set_logits(np.where(masked, NEG_INF, x))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or shape.width is None or shape.width > DEVICE_SMALL_WIDTH:
            # Wide rows: the mean and the variance are left-to-right binary32 sums over the whole vocabulary,
            # whose rounding error is far above the spacing of the logits near the threshold, so no other
            # arithmetic decides which logits fall below it; replaying the sums takes an operation per entry.
            return None
        return shape

    def device_apply(self, rows, members) -> None:
        """Exact on narrow rows: the mean and variance sums are replayed left to right, one column at a time."""
        import torch

        from samplechain.rows import F32, F64, NEG_INF, seq_sum_f32

        x = rows.logits
        mask = rows.mask()
        finite = x > NEG_INF if mask is None else (x > NEG_INF) & mask
        count = finite.sum(1, keepdim=True)
        n = count.to(F32)
        mx = torch.where(finite, x, NEG_INF).amax(1, keepdim=True)
        mean = seq_sum_f32(torch.where(finite, x, 0.0)) / n
        var = seq_sum_f32(torch.where(finite, ((x - mean).to(F64) ** 2).to(F32), 0.0))
        thr = mx - rows.param(members, "n") * torch.sqrt(var / n)
        active = (rows.count() > 1) & (count > 0)
        rows.set_logits(x.masked_fill(active & (x < thr), NEG_INF))  # sorted rows stay sorted


def _xtc_bounds(rows, members, ulp: float) -> tuple:
    """Per-row ``[t (1 + b), t (1 - b)]`` and ``min_keep``; b bounds the relative distance between llama.cpp's
    binary32 softmax (within (W + 1) units of roundoff) and the one here (torch's exp within 2 ulps, a running
    sum of W terms, a division)."""
    import torch

    b = (2 * rows.width + 8) * ulp
    t = torch.tensor([[float(m.t) * (1 + b), float(m.t) * (1 - b)] for m in members], device=rows.device)
    return t, torch.tensor([[m.min_keep] for m in members], dtype=torch.int64, device=rows.device)


class XTC(SeededSampler):
    """Exclude Top Choices: with probability ``p``, drops every token above threshold ``t`` but the last one."""

    name = "xtc"
    effect = FILTER

    def __init__(self, p: float, t: float, min_keep: int = 1, seed: int = DEFAULT_SEED) -> None:
        self.p = F32(check_number("xtc_probability", p))
        self.t = F32(check_number("xtc_threshold", t))
        self.min_keep = check_int("min_keep", min_keep, minimum=0)
        self.disabled = bool(self.p <= 0.0 or self.t > 0.5)
        super().__init__(seed)

    def params(self) -> dict:
        return {"p": float(self.p), "t": float(self.t), "min_keep": self.min_keep, "seed": self.seed}

    def apply(self, c: Candidates) -> None:
        if self.disabled or len(c) < 2:
            return
        if self.rng.uniform_float() > self.p:
            return
        probs = softmax(c, do_sort=True)
        # Masked entries (p = 0) are never "top choices", even with t = 0 (llama.cpp would keep one).
        below = np.flatnonzero((probs < self.t) | (probs == 0.0))
        last = int(below[0]) if len(below) else len(probs)
        last = last - 1 if last > 0 else 0  # index of the last entry >= t
        if last > 0 and len(c) - last >= self.min_keep:
            c.take(slice(last, None))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or not shape.sorted or self.t <= 0.0:
            # Unsorted rows: when XTC fires the CPU sorts the row, and whether it fires is each row's own draw;
            # the order of the rows after it would differ row by row. t = 0: "probability exactly 0" would be
            # decided by expf underflow.
            return None
        return shape

    def device_input(self) -> tuple[float]:
        """The draw apply() makes when the row has two candidates or more: 1.0 when XTC fires."""
        return (1.0 if self.rng.uniform_float() <= self.p else 0.0,)

    def device_apply(self, rows, members) -> None:
        """On sorted rows: the probabilities against t with a bound on llama.cpp's binary32 softmax (rows where
        XTC fires and a probability lies within it of t are redone on the CPU); the dropped entries are a
        prefix, so the row shifts and stays sorted."""
        import torch

        from samplechain.rows import ULP32

        fire = rows.step_input() > 0.0  # [B, 1]
        n = rows.count()
        acts = fire & (n >= 2)
        rows.drew(n >= 2)  # the CPU draws only with two candidates or more
        e = torch.exp(rows.logits - rows.first())
        probs = e / rows.at_last(e.cumsum(1))
        t_hilo, min_keep = rows.constant(("t", rows.width), lambda: _xtc_bounds(rows, members, ULP32))
        above = (probs[:, :, None] >= t_hilo[:, None, :]).sum(1).minimum(n)  # [B, 2]: surely >= t, maybe >= t
        rows.flag(acts & (above[:, :1] != above[:, 1:]))
        last = (above[:, :1] - 1).clamp(min=0)  # the last entry >= t stays
        drop = torch.where(acts & (last > 0) & (n - last >= min_keep), last, 0)
        rows.take((rows.arange() + drop).clamp(max=rows.width - 1))
        rows.keep_first(n - drop)
