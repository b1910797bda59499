"""The probability filters among the truncation samplers: top-p, min-p and typical, which keep candidates by
their softmax probabilities (with the binary32 sums that decide them); apart from ``truncation.py`` by family."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from samplechain._numeric import (
    F32,
    F64,
    expf_split,
    logf,
    logf_array,
    running_sum_f32,
    seq_sum_f32,
)
from samplechain.candidates import Candidates
from samplechain.samplers._ops import SMALL_SORT, indices_at_least, softmax
from samplechain.samplers.base import DEVICE_SMALL_WIDTH, FILTER, DeviceShape, Sampler, Watched
from samplechain.validate import check_int, check_number


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


class _ProbabilityFilter(Watched, Sampler):
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

    def params(self) -> dict:
        return {"p": float(self.p), "min_keep": self.min_keep}


class TopP(_ProbabilityFilter):
    """Nucleus sampling: the smallest descending prefix whose probability mass reaches ``p``."""

    name = "top-p"
    _field = "top_p"

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if self.disabled or n == 0:
            return
        if c.sorted or n <= SMALL_SORT or not self._apply_large(c):
            probs = softmax(c, do_sort=False)  # summed in the incoming order, then sorted (as llama.cpp)
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
        total, head_idx, head_e = softmax_sum_f32(np.subtract(x, c.max_logit))
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
        e = rows.exp_rel(m).to(F64)  # summed in the incoming order (as llama.cpp), then sorted
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


def softmax_sum_f32(d: np.ndarray) -> tuple[np.float32, np.ndarray, np.ndarray]:
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
        self.log_p = logf(self.p) if not self.disabled else F32(0.0)  # the threshold's offset from the top logit

    @staticmethod
    def _disabled_for(p: np.float32) -> bool:
        return bool(p <= 0.0)

    def apply(self, c: Candidates) -> None:
        if self.disabled or len(c) == 0:
            return
        if not c.sorted:
            thr = c.max_logit + self.log_p
            keep = indices_at_least(c, thr)
            if len(keep) and len(keep) >= self.min_keep:
                if len(keep) < len(c):
                    c.take(keep)
                return
            c.sort()
        c.truncate(min_p_sorted_size(c.logits, self.log_p, self.min_keep))

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        if self.disabled:
            return shape
        if shape.selected or not (shape.sorted or (self.min_keep <= 1 and self.p <= 1.0)):
            return None  # unsorted input with too few survivors is sorted on the CPU: data-dependent order
        return shape

    def device_key(self) -> tuple:
        return (self.min_keep <= 1 and self.p <= 1.0,)

    def device_apply(self, rows, members) -> None:
        log_p = rows.param(members, "log_p")
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
        # Zero probabilities (-inf logits) are skipped in the entropy; llama.cpp (llama_sampler_typical_apply)
        # lets 0*log(0) = NaN poison it.
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
