"""Samplers that remove or mask candidates: top-k, top-p, min-p, typical, top-n-sigma, XTC (spec §3.3-3.10)."""

from __future__ import annotations

from bisect import bisect_left

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

def nucleus_size(p_desc: np.ndarray, p: np.float32, min_keep: int) -> int:
    """Smallest prefix whose binary32 running sum reaches ``p`` with at least ``min_keep`` entries; 0 if none."""
    run = running_sum_f32(p_desc)
    if not run[-1] >= p:  # the running sum is non-decreasing: it never reaches p
        return 0
    i = int(run.searchsorted(p))  # the first running sum >= p
    if i < min_keep - 1:
        i = min_keep - 1
    return i + 1 if i < len(run) else 0


def nucleus_size_from_sums(q: list[float], p: np.float32, min_keep: int) -> int | None:
    """``nucleus_size(softmax_values(x, x[0]), p, min_keep)`` for descending logits ``x``, from
    ``q = running_sum_f64(expf(x - x[0])).tolist()`` alone where that decides it; None where it cannot.

    The binary32 running sums of the binary32 probabilities are within ``(2n + 16) * 2**-24`` of the ratios
    ``q[i] / q[-1]``: each is ``(sum of the first i + 1 exponentials) / (their binary32 total)`` up to one
    rounding per term and per addition, the total is the exact sum up to n - 1 roundings, and every value is
    at most about 1 (the first exponential is expf(0) = 1, so no sum is subnormal; a subnormal quotient is off
    by at most 2**-150). So the first ratio clear of p by that margin, preceded by one clear below it, is the
    cut the binary32 sums make.
    """
    n = len(q)
    total = q[-1]
    margin = (2 * n + 16) * 2.0**-24
    p = float(p)
    i = bisect_left(q, (p + margin) * total)  # the first ratio surely >= p
    if i >= n or (i > 0 and q[i - 1] >= (p - margin) * total):
        return None  # too close to call: the binary32 sums decide
    if i < min_keep - 1:
        i = min_keep - 1
    return i + 1 if i < n else 0


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
            probs = softmax(c, do_sort=False)  # summed in the incoming order, then sorted (spec §3.4)
            if not c.sorted:
                c.sort()
                probs = c.probs
            keep = nucleus_size(probs, self.p, self.min_keep)
            if keep:
                c.truncate(keep)

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
        keep = nucleus_size(p_desc, self.p, self.min_keep)
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
        """The nucleus, with a bound on how far llama.cpp's binary32 softmax sums can be from the sums used here;
        rows within it of the cut are redone on the CPU. Wide unsorted rows keep their top 128 candidates,
        sort-free; a larger nucleus is redone on the CPU."""
        if not rows.sorted and rows.width > DEVICE_SMALL_WIDTH:
            self._device_wide(rows, members)
            return
        import torch

        from samplechain.rows import F64

        rows.sort()  # the CPU sums in the incoming order, then sorts: the bound covers any order
        p_lohi, min_keep = rows.constant(("p", rows.width), lambda: _nucleus_bounds(rows, members))
        run = torch.exp((rows.logits - rows.first()).to(F64)).cumsum(1)  # dead entries past n come after
        idx = torch.searchsorted(run / rows.at_last(run), p_lohi)  # [B, 2]: ratios below p (1 -+ bound)
        rows.flag(idx.diff(dim=1))
        keep = idx[:, :1] + 1  # at most n: the ratio at the last candidate is 1 >= p
        if min_keep is not None:
            keep = torch.maximum(keep, min_keep).minimum(rows.count())
        rows.keep_first(keep)

    def _device_wide(self, rows, members) -> None:
        import torch

        from samplechain.rows import F64, ULP32, near, stable_order, top_candidates

        p = rows.param(members, "p").to(F64)
        min_keep = rows.param(members, "min_keep", torch.int64)
        n = rows.count()
        m = rows.row_max()
        e = rows.exp_rel(m).to(F64)  # summed in the incoming order (spec §3.4), then sorted
        total = e.sum(1, keepdim=True)
        # |binary32 left-to-right sum - exact sum| <= sum_j min(e_j, half an ulp of the running sum)
        slack = (torch.minimum(e, total * (ULP32 * 1.001)).sum(1, keepdim=True) + 4 * ULP32 * total) / total
        cap = min(_DEVICE_NUCLEUS_CAP, rows.width - 1)
        v, pos = stable_order(*top_candidates(rows, cap + 1))
        rows.take(pos[:, :cap], v[:, :cap])
        rows.live = None
        rows.sorted = True
        n = n.clamp(max=cap)
        probs = rows.exp_rel(m).to(F64) / total
        rows.flag(probs.sum(1, keepdim=True) < p * (1 + slack) + 1e-12)  # the nucleus may pass the cut
        run = probs.cumsum(1)
        i = torch.maximum((run < p).sum(1, keepdim=True), min_keep - 1)
        rows.flag(near(run, p, p * (slack + (cap + 4) * ULP32)))
        keep = torch.where(i < n, i + 1, n)
        # a kept value equal to the first one left out: which of the equal entries were found is open
        rows.flag(v.gather(1, keep - 1) == v[:, cap:])
        rows.keep_first(keep)


def _nucleus_bounds(rows, members) -> tuple:
    """Per-row ``[p (1 - b), p (1 + b)]`` (binary64) and the ``min_keep`` limits (None when all are <= 1).

    b bounds the relative distance between llama.cpp's running sum of binary32 probabilities over n <= W
    candidates (expf rounded, a left-to-right binary32 sum, a division, a second running sum: within
    (2n + 2) units of binary32 roundoff of the exact ratio) and the binary64 ratio here.
    """
    import torch

    from samplechain.rows import F64, ULP32

    b = (2 * rows.width + 6) * ULP32
    p_lohi = torch.tensor([[float(m.p) * (1 - b), float(m.p) * (1 + b)] for m in members], dtype=F64,
                          device=rows.device)
    if all(m.min_keep <= 1 for m in members):
        return p_lohi, None
    return p_lohi, torch.tensor([[m.min_keep] for m in members], dtype=torch.int64, device=rows.device)


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
        c.truncate(min_p_sorted_size(c.logits, self._log_p, self.min_keep))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or not (shape.sorted or (self.min_keep <= 1 and self.p <= 1.0)):
            return None  # unsorted input with too few survivors is sorted on the CPU: data-dependent order
        return shape

    def device_key(self) -> tuple:
        return (self.min_keep <= 1 and self.p <= 1.0,)

    def device_apply(self, rows, members) -> None:
        log_p = rows.param(members, "_log_p")
        if not rows.sorted:
            # strictly below the threshold goes (llama.cpp's device form also dropped entries equal to it)
            rows.remove(rows.logits < rows.row_max() + log_p)
            return
        # the entries >= first + log p are a prefix (entries past n are smaller than every candidate)
        keep = (rows.logits >= rows.first() + log_p).sum(1, keepdim=True).minimum(rows.count())
        floor = rows.constant("floor", lambda: _min_p_floor(rows, members))
        if floor is not None:  # at least one entry (p > 1 can leave none), and min_keep of them
            keep = keep.maximum(floor).minimum(rows.count())
        rows.keep_first(keep)


def _xtc_bounds(rows, members, ulp: float) -> tuple:
    """Per-row ``[t (1 + b), t (1 - b)]`` and ``min_keep``; b bounds the relative distance between llama.cpp's
    binary32 softmax (within (W + 1) units of roundoff) and the one here (torch's exp within 2 ulps, a running
    sum of W terms, a division)."""
    import torch

    b = (2 * rows.width + 8) * ulp
    t = torch.tensor([[float(m.t) * (1 + b), float(m.t) * (1 - b)] for m in members], device=rows.device)
    return t, torch.tensor([[m.min_keep] for m in members], dtype=torch.int64, device=rows.device)


def _min_p_floor(rows, members):
    """``[B, 1]`` max(min_keep, 1): the least a sorted row keeps (up to its count); None when it cannot bind
    (min_keep <= 1 and p <= 1, so the first entry always reaches the threshold)."""
    import torch

    if all(m.min_keep <= 1 and m.p <= 1.0 for m in members):
        return None
    return torch.tensor([[max(m.min_keep, 1)] for m in members], dtype=torch.int64, device=rows.device)


def min_p_sorted_size(x: np.ndarray, log_p: np.float32, min_keep: int) -> int:
    """How many of the sorted logits ``x`` min-p keeps: those ``>= x[0] + log_p``, at least 1 and ``min_keep``."""
    # sorted descending: the entries >= thr are a prefix; the first entry is always kept
    n_keep = int(np.count_nonzero(x >= x[0] + log_p)) or 1
    return max(n_keep, min(min_keep, len(x)))


def min_p_descending_size(x: list[float], log_p: np.float32, min_keep: int) -> int:
    """:func:`min_p_sorted_size` for logits known to be in descending order (the sorted flag alone does not
    promise it after a sampler that masks entries), given as a list: a binary search."""
    # x[0] + log_p in binary32, as min_p_sorted_size: the binary64 sum of two binary32 values rounded once more
    # to binary32 is the binary32 sum (53 >= 2 * 24 + 2 bits: double rounding is innocuous)
    thr = float(F32(x[0] + float(log_p)))
    n = len(x)
    n_keep = n - bisect_left(x[::-1], thr) or 1
    return max(n_keep, min(min_keep, n))


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

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or shape.width is None or shape.width > DEVICE_SMALL_WIDTH:
            # Wide rows: the softmax sum, the entropy and the running sum in score order are llama.cpp's
            # left-to-right binary32 sums over the whole vocabulary, and the kept candidates come out in score
            # order; replaying that exactly takes a full sort and one operation per vocabulary entry.
            return None
        return shape.but(sorted=False)

    def device_apply(self, rows, members) -> None:
        """Exact on narrow rows: llama.cpp's binary32 sums (softmax, entropy, running sum in score order) are
        replayed left to right, one column at a time; the kept candidates are in score order."""
        import torch

        from samplechain.rows import F32, F64, seq_cumsum_f32, seq_sum_f32

        rows.sort()
        e = rows.zero_dead(rows.exp_rel(rows.first()))
        probs = e / seq_sum_f32(e)
        logp = torch.log(probs.to(F64)).to(F32)
        entropy = seq_sum_f32(torch.where(probs > 0.0, -(probs * logp), 0.0))
        # zero probabilities score +inf; entries past the candidates (probability 0) stay behind them
        order = (-logp - entropy).abs().sort(dim=1, stable=True).indices
        run = seq_cumsum_f32(probs.gather(1, order))
        first = rows.constant("first", lambda: torch.tensor([[max(m.min_keep - 1, 0)] for m in members],
                                                            dtype=torch.int64, device=rows.device))
        keep = ((run <= rows.param(members, "p")).sum(1, keepdim=True).maximum(first) + 1).minimum(rows.count())
        rows.n = None  # reordered: the candidates are the first `keep` entries, in score order
        rows.sorted = False
        rows.take(order)
        rows.keep_first(keep)


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
