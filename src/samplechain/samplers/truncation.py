"""Samplers that remove or mask candidates: top-k, top-p, min-p, typical, top-n-sigma, XTC (spec §3.3-3.10)."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import (
    F32,
    F64,
    NEG_INF,
    expf_split,
    logf,
    logf_array,
    running_sum_f32,
    seq_sum_f32,
)
from samplechain.candidates import Candidates
from samplechain.rng import DEFAULT_SEED
from samplechain.samplers._ops import _SMALL, apply_top_k, check_int, check_number, indices_at_least, softmax
from samplechain.samplers.base import DEVICE_SMALL_WIDTH, FILTER, DeviceShape, Sampler
from samplechain.samplers.selectors import SeededSampler


class TopK(Sampler):
    """Keeps the ``k`` largest logits, sorted descending; ``k <= 0`` is a no-op."""

    name = "top-k"
    effect = FILTER

    def __init__(self, k: int) -> None:
        self.k = check_int("top_k", k)
        self.disabled = self.k <= 0

    def _params(self) -> dict:
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
        import torch

        from samplechain.device.rows import NEG_INF, top_sorted

        k = rows.param(members, "k", torch.int64).clamp(max=rows.width)
        width = min(max(m.k for m in members), rows.width)
        if rows.sorted:
            rows.keep_first(k)
            rows.gather(rows.arange(width).expand(rows.batch, -1))
            return
        v, pos = top_sorted(rows, width)
        kth = v.gather(1, k - 1)
        if v.shape[1] > width:  # equal values across the cut: which of them survive is llama.cpp's tie order
            rows.flag((v.gather(1, k.clamp(max=v.shape[1] - 1)) == kth) & (k < rows.width) & (kth > NEG_INF))
        finite = ((v[:, :width] > NEG_INF) & (rows.arange(width) < k)).sum(1, keepdim=True)
        rows.flag((kth == NEG_INF) & (finite < rows.count()))  # live -inf entries reach the cut
        rows.gather(pos[:, :width])
        rows.keep_first(k)
        rows.sorted = True


def _nucleus_size(p_desc: np.ndarray, p: np.float32, min_keep: int) -> int:
    """Smallest prefix whose binary32 running sum reaches ``p`` with at least ``min_keep`` entries; 0 if none."""
    run = running_sum_f32(p_desc)
    if not run[-1] >= p:  # the running sum is non-decreasing: it never reaches p
        return 0
    i = max(int(run.searchsorted(p, side="left")), min_keep - 1)
    return i + 1 if i < len(run) else 0


# Wide rows: top-p keeps at most this many candidates on the device.
_DEVICE_NUCLEUS_CAP = 128


class _ProbabilityFilter(Sampler):
    """Shared parameters of top-p, min-p and typical: a probability ``p`` and ``min_keep`` survivors."""

    effect = FILTER
    _field = ""

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = F32(check_number(self._field, p))
        self.min_keep = check_int("min_keep", min_keep, minimum=0)
        self.disabled = self._disabled_for(self.p)

    @staticmethod
    def _disabled_for(p: np.float32) -> bool:
        return bool(p >= 1.0)

    def _params(self) -> dict:
        return {"p": float(self.p), "min_keep": self.min_keep}


class TopP(_ProbabilityFilter):
    """Nucleus sampling: the smallest descending prefix whose probability mass reaches ``p``."""

    name = "top-p"
    _field = "top_p"

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if self.disabled or n == 0:
            return
        if c.sorted or n <= _SMALL or not self._apply_large(c):
            softmax(c, do_sort=False)  # summed in the incoming order, then sorted (spec §3.4)
            c.sort()
            keep = _nucleus_size(c.probs, self.p, self.min_keep)
            c.truncate(keep if keep else n)

    def _apply_large(self, c: Candidates) -> bool:
        """Unsorted large input without a full sort: same result, touching each logit a few times.

        The binary32 softmax sum is rebuilt exactly from the entries that can change it; the nucleus is then
        searched among the largest entries, growing the set until its mass exceeds ``p`` with margin.
        """
        x = c.logits
        total, head_idx, head_e = _softmax_sum_f32(np.subtract(x, c.max_logit))
        need = (float(self.p) + 1e-3) * float(total)
        if float(np.add.reduce(head_e, dtype=F64)) < need:
            return False  # a flat distribution: the nucleus reaches into the tail
        m = 64
        while True:
            if m < len(head_e):
                kth = np.partition(head_e, len(head_e) - m)[len(head_e) - m]
                top = (head_e >= kth).nonzero()[0]  # ties at the boundary all included
            else:
                top = np.arange(len(head_e))
            if m >= len(head_e) or float(np.add.reduce(head_e[top], dtype=F64)) >= need:
                break
            m *= 4
        order = np.negative(x[head_idx[top]]).argsort(kind="stable")  # head_idx ascending: ties by position
        idx = head_idx[top][order]
        p_desc = np.true_divide(head_e[top][order], total)
        keep = _nucleus_size(p_desc, self.p, self.min_keep)
        if keep == 0:
            return False
        c.replace(c.ids[idx[:keep]], x[idx[:keep]], p_desc[:keep], sorted=True)
        return True

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected:
            return None
        if shape.sorted or (shape.width is not None and shape.width <= DEVICE_SMALL_WIDTH):
            return shape.but(sorted=True)
        return shape.but(width=_DEVICE_NUCLEUS_CAP, identity=False, sorted=True)

    def device_apply(self, rows, members) -> None:
        """The nucleus, with a bound on how far llama.cpp's binary32 softmax sums can be from the binary64 ones
        used here (rows within it of the cut are redone on the CPU). Wide unsorted rows keep their top 128
        candidates, sort-free; a larger nucleus is redone on the CPU."""
        import torch

        from samplechain.device.rows import F64, ULP32, near, top_sorted

        p = rows.param(members, "p").to(F64)
        min_keep = rows.param(members, "min_keep", torch.int64)
        n = rows.count()
        m = rows.row_max()
        e = rows.exp_rel(m).to(F64)  # summed in the incoming order (spec §3.4), then sorted
        total = e.sum(1, keepdim=True)
        # |binary32 left-to-right sum - exact sum| <= sum_j min(e_j, half an ulp of the running sum)
        if rows.width <= DEVICE_SMALL_WIDTH:
            slack = (rows.width + 2) * ULP32
        else:
            slack = (torch.minimum(e, total * (ULP32 * 1.001)).sum(1, keepdim=True) + 4 * ULP32 * total) / total
        if not rows.sorted and rows.width > DEVICE_SMALL_WIDTH:
            cap = min(_DEVICE_NUCLEUS_CAP, rows.width)
            rows.gather(top_sorted(rows, cap)[1][:, :cap])
            n = n.clamp(max=cap)
        else:
            rows.sort()
        rows.sorted = True
        probs = rows.exp_rel(m).to(F64) / total
        rows.flag(probs.sum(1, keepdim=True) < p * (1 + slack) + 1e-12)  # the nucleus may pass the cut
        run = probs.cumsum(1)
        i = torch.maximum((run < p).sum(1, keepdim=True), min_keep - 1)
        rows.flag(near(run, p, p * (slack + (rows.width + 4) * ULP32)))
        rows.keep_first(torch.where(i < n, i + 1, n))


_SIGNIFICANT = F32(-17.5)  # e^-17.5 < 2^-25: below half an ulp of any binary32 sum that holds a value >= 1


def _softmax_sum_f32(d: np.ndarray) -> tuple[np.float32, np.ndarray, np.ndarray]:
    """``sum(expf(d))`` as llama.cpp's softmax accumulates it: binary32, left to right, ``d = x - max <= 0``.

    Adding a term below half an ulp of the running sum leaves it unchanged, and the running sum never
    decreases: once the sum holds ``expf(d_r)`` for some earlier entry r, later terms with
    ``d < d_r - 17.5`` are exact no-ops. Those are skipped, so only entries near a running maximum are summed.
    Also returns the positions of the entries with ``d >= -12`` and their exact ``expf(d)``.
    """
    n = len(d)
    keep = np.zeros(n, dtype=bool)
    end = n
    for _ in range(8):  # a few running maxima cover realistic logits; the rest is summed in full below
        if end == 0:
            break
        seg = d[:end]
        pos = int(seg.argmax())
        level = seg[pos]
        if level < F32(-80.0):  # everything left is (nearly) zero
            break
        keep[pos:end] = seg[pos:] >= level + _SIGNIFICANT
        end = pos
    keep[:end] = True
    sig = keep.nonzero()[0]
    e, head, e_head = expf_split(d[sig])  # exact where it matters, see expf_rel
    return seq_sum_f32(e), sig[head], e_head


class MinP(_ProbabilityFilter):
    """Keeps candidates whose probability is at least ``p`` times the largest one."""

    name = "min-p"
    _field = "min_p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        super().__init__(p, min_keep)
        self._log_p = logf(self.p) if not self.disabled else F32(0.0)

    @staticmethod
    def _disabled_for(p: np.float32) -> bool:
        return bool(p <= 0.0)

    def apply(self, c: Candidates) -> None:
        if self.disabled or len(c) == 0:
            return
        if not c.sorted:
            thr = c.max_logit + self._log_p
            keep = indices_at_least(c, thr)
            if len(keep) and len(keep) >= self.min_keep:
                if len(keep) < len(c):
                    c.take(keep)
                return
            c.sort()
        x = c.logits
        # sorted descending: the entries >= thr are a prefix; the first entry is always kept
        n_keep = max(int(np.count_nonzero(x >= x[0] + self._log_p)), 1)
        c.truncate(max(n_keep, min(self.min_keep, len(x))))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or not (shape.sorted or self.min_keep <= 1):
            return None  # unsorted input with too few survivors is sorted on the CPU: data-dependent order
        return shape

    def device_key(self) -> tuple:
        return (self.min_keep <= 1,)

    def device_apply(self, rows, members) -> None:
        import torch

        log_p = rows.param(members, "_log_p")
        if not rows.sorted:
            # strictly below the threshold goes (llama.cpp's device form also dropped entries equal to it)
            rows.remove(rows.logits < rows.row_max() + log_p)
            return
        n = rows.count()
        above = (rows.logits >= rows.logits[:, :1] + log_p).sum(1, keepdim=True).clamp(min=1)
        min_keep = rows.param(members, "min_keep", torch.int64)
        rows.keep_first(torch.maximum(above, torch.minimum(min_keep, n)))


class Typical(_ProbabilityFilter):
    """Locally typical sampling: keeps the tokens whose surprise is closest to the entropy, mass > ``p``."""

    name = "typical"
    _field = "typical_p"

    def apply(self, c: Candidates) -> None:
        if self.disabled or len(c) == 0:
            return
        probs = softmax(c, do_sort=True)
        logp = logf_array(probs)
        # Zero probabilities (-inf logits) are skipped in the entropy; llama.cpp lets 0*log(0) = NaN
        # poison it (spec P5).
        with np.errstate(invalid="ignore"):
            terms = np.where(probs > 0, -(probs * logp), F32(0.0))
            entropy = seq_sum_f32(terms.astype(F32))
            scores = np.abs(-logp - entropy)
        order = np.argsort(scores, kind="stable")
        run = np.cumsum(probs[order], dtype=F32)
        first = max(self.min_keep - 1, 0)
        hits = np.flatnonzero(run[first:] > self.p)
        keep = first + int(hits[0]) + 1 if len(hits) else len(order)
        c.take(order[:keep], sorted=False)


class TopNSigma(Sampler):
    """Masks logits more than ``n`` standard deviations below the maximum (over finite logits)."""

    name = "top-n-sigma"
    effect = FILTER

    def __init__(self, n: float) -> None:
        self.n = F32(check_number("top_n_sigma", n))
        self.disabled = bool(self.n <= 0.0)

    def _params(self) -> dict:
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

    def _params(self) -> dict:
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
