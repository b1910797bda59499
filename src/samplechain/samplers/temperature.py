"""Temperature and dynamic temperature (llama.cpp's llama_sampler_temp_impl, llama_sampler_temp_apply and
llama_sampler_temp_ext_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import F32, F64, NEG_INF, logf, logf_array, powf, seq_sum_f32
from samplechain.candidates import Candidates
from samplechain.samplers._ops import softmax
from samplechain.samplers.base import DEVICE_SMALL_WIDTH, DeviceShape, Sampler, Watched
from samplechain.validate import check_number

_FLT_MAX = float(np.finfo(F32).max)


def _abs_max(x: np.ndarray | list[float], sorted: bool, hi: np.float32) -> float:
    """Largest magnitude among the finite logits ``x`` with maximum ``hi`` (-inf entries stay -inf when
    divided)."""
    lo = float(x[-1] if sorted else np.minimum.reduce(x))
    if lo == -np.inf:
        x = np.asarray(x, dtype=F32)
        finite = x[x > -np.inf]
        lo = float(np.minimum.reduce(finite)) if len(finite) else 0.0
    return max(abs(float(hi)), abs(lo))


def divides(x: np.ndarray | list[float], t: np.float32, sorted: bool, c: Candidates | None = None) -> bool:
    """Whether the temperature helper divides the logits ``x`` by ``t`` rather than keeping only the maximum.

    Dividing by t < 1 overflows when |logit| > FLT_MAX * t; such a temperature is treated as its limit,
    greedy (llama.cpp turns the logits into +inf and the probabilities into NaN). Unsorted ``x`` needs the
    candidates ``c`` it belongs to (their cached maximum); sorted ones may be a list.
    """
    t = float(t)
    if t >= 1.0:
        return True
    if not t > 0.0:
        return False
    return _abs_max(x, sorted, x[0] if sorted else c.max_logit) <= _FLT_MAX * t


def scale(c: Candidates, t: np.float32) -> None:
    """llama.cpp's temperature helper: divide by ``t``; ``t <= 0`` keeps only the first maximum."""
    if len(c) == 0:
        return
    x = c.logits
    if divides(x, t, c.sorted, c):
        c.set_logits(np.true_divide(x, t))
        return
    keep = int(np.argmax(x))
    masked = np.full(len(x), NEG_INF, dtype=F32)
    masked[keep] = x[keep]
    c.set_logits(masked)


def device_scale(rows, t) -> None:
    """:func:`scale` on device rows with per-row temperatures ``t`` ([B, 1] binary32)."""
    import torch

    x = rows.logits
    finite = x > float("-inf")
    mask = rows.mask()
    if mask is not None:
        finite = finite & mask
    magnitude = torch.where(finite, x.abs(), 0.0).amax(1, keepdim=True)
    divide = (t > 0.0) & ((t >= 1.0) | (magnitude.to(torch.float64) <= _FLT_MAX * t.to(torch.float64)))
    only_max = torch.where(rows.arange() == rows.first_max(), x, float("-inf"))
    rows.set_logits(torch.where(divide, x / torch.where(divide, t, 1.0), only_max))


def device_scale_fixed(rows, members) -> None:
    """:func:`device_scale` with each row's own fixed ``t`` (the members' ``t``), in a few operations on sorted
    rows: a division, plus a mask for rows with t <= 0 (their first entry is their first maximum) and, for rows
    with 0 < t < 1, a check that no finite logit exceeds FLT_MAX * t (the CPU would keep only the maximum
    there; such rows are redone on the CPU)."""
    if not rows.sorted:
        device_scale(rows, rows.param(members, "t"))
        return
    t_div, limit, greedy = rows.constant(("scale", rows.width), lambda: _fixed_scale(rows, members))
    x = rows.logits
    if limit is not None:
        rows.flag(x.abs().nan_to_num(posinf=0.0) > limit)  # -inf logits stay -inf
    q = x / t_div
    rows.set_logits(q if greedy is None else q.masked_fill(greedy, float("-inf")))


def _fixed_scale(rows, members) -> tuple:
    """Per-row divisors, overflow limits (the largest binary32 <= FLT_MAX * t; None when no row needs one) and
    the mask of entries a t <= 0 row sets to -inf (None when no row has t <= 0)."""
    import torch

    ts = [float(m.t) for m in members]
    t_div = torch.tensor([[t if t > 0.0 else 1.0] for t in ts], dtype=torch.float32, device=rows.device)
    limit = greedy = None
    if any(0.0 < t < 1.0 for t in ts):
        lim = []
        for t in ts:
            v = F32(_FLT_MAX * t) if 0.0 < t < 1.0 else F32(np.inf)  # FLT_MAX * t is exact in binary64
            lim.append(float(np.nextafter(v, F32(0.0)) if float(v) > _FLT_MAX * t else v))
        limit = torch.tensor([[v] for v in lim], dtype=torch.float32, device=rows.device)
    if any(not t > 0.0 for t in ts):
        low = torch.tensor([[not t > 0.0] for t in ts], device=rows.device)
        greedy = low & (rows.arange() > 0)
    return t_div, limit, greedy


class Temperature(Watched, Sampler):
    """Divides the logits by ``t``; ``t <= 0`` keeps only the first largest logit; ``t == 1`` is a no-op."""

    name = "temp"

    def __init__(self, t: float) -> None:
        self.t = F32(check_number("temperature", t))
        self.disabled = bool(self.t == 1.0)

    def params(self) -> dict:
        return {"t": float(self.t)}

    def apply(self, c: Candidates) -> None:
        if not self.disabled:
            scale(c, self.t)

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        return shape if not shape.selected or self.disabled else None

    def device_apply(self, rows, members) -> None:
        # t <= 0 keeps every candidate, all but the first maximum at -inf (llama.cpp's device form shrank the row)
        device_scale_fixed(rows, members)


class DynamicTemperature(Watched, Sampler):
    """llama.cpp's ``temp_ext``: temperature in ``[t - delta, t + delta]`` chosen by normalised entropy."""

    name = "temp-ext"

    def __init__(self, t: float, delta: float, exponent: float) -> None:
        self.t = F32(check_number("temperature", t))
        self.delta = F32(check_number("dynatemp_range", delta))
        self.exponent = F32(check_number("dynatemp_exponent", exponent))
        self.disabled = bool(self.t == 1.0 and self.delta <= 0.0)

    def params(self) -> dict:
        return {"t": float(self.t), "delta": float(self.delta), "exponent": float(self.exponent)}

    def apply(self, c: Candidates) -> None:
        if self.disabled:
            return
        if self.delta <= 0.0:
            scale(c, self.t)
            return
        lo = max(F32(0.0), self.t - self.delta)
        hi = self.t + self.delta
        n = len(c)
        if n <= 1:
            return
        max_entropy = -logf(F32(1.0) / F32(n))
        probs = softmax(c, do_sort=True)
        nz = probs[probs > 0.0]
        entropy = -seq_sum_f32(nz * logf_array(nz))
        dyn = lo + (hi - lo) * powf(entropy / max_entropy, self.exponent)
        scale(c, F32(dyn))
        x = c.logits
        q = np.exp(x.astype(F64) - F64(x[0]))
        total = np.cumsum(q)[-1]
        c.set_probs((q.astype(F32).astype(F64) / total).astype(F32))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected:
            return None
        if self.delta <= 0.0:
            return shape
        if shape.width is None or shape.width > DEVICE_SMALL_WIDTH:
            return None  # the entropy is a binary32 sum over the whole row: replayed exactly only on narrow rows
        return shape.but(sorted=True)

    def device_key(self) -> tuple:
        return (self.delta > 0.0,)

    def device_apply(self, rows, members) -> None:
        import torch

        from samplechain.rows import F32, F64, seq_sum_f32

        if self.delta <= 0.0:
            device_scale_fixed(rows, members)
            return
        t = rows.param(members, "t")
        delta = rows.param(members, "delta")
        exponent = rows.param(members, "exponent")
        rows.sort()  # the softmax helper sorts; a single candidate stays as it is (its order is moot)
        n = rows.count()
        e = rows.zero_dead(rows.exp_rel(rows.first()))
        probs = e / seq_sum_f32(e)
        terms = torch.where(probs > 0.0, probs * torch.log(probs.to(F64)).to(F32), 0.0)
        entropy = -seq_sum_f32(terms)
        max_entropy = -torch.log((1.0 / n.to(F32)).to(F64)).to(F32)
        ratio = torch.pow((entropy / max_entropy).to(F64), exponent.to(F64)).to(F32)
        lo = (t - delta).clamp(min=0.0)
        dyn = lo + ((t + delta) - lo) * ratio
        before = rows.logits
        device_scale(rows, torch.where(n > 1, dyn, 1.0))
        rows.set_logits(torch.where(n > 1, rows.logits, before))
