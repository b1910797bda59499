"""Selecting samplers without their own distribution logic: greedy and dist (llama.cpp's
llama_sampler_greedy_apply and llama_sampler_dist_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

import numpy as np

from samplechain._numeric import F32, F64, expf_rel, running_sum_f64
from samplechain.candidates import Candidates
from samplechain.rng import DEFAULT_SEED, LlamaRng, check_seed, resolve_seed
from samplechain.samplers.base import SELECTOR, DeviceShape, Sampler, Watched

# A device draw whose target lies this close (relative to the total mass) to a cumulative boundary is redone on
# the CPU: the device's binary32 exponentials may differ from expf by an ulp or two.
_DRAW_MARGIN = 1e-6


def _select_plan(shape: DeviceShape) -> DeviceShape | None:
    return None if shape.selected else shape.but(selected=True)


class Greedy(Sampler):
    """Selects the first candidate with the largest logit. Empty candidates select nothing."""

    name = "greedy"
    effect = SELECTOR

    def apply(self, c: Candidates) -> None:
        c.selected = int(c.logits.argmax()) if len(c) else -1

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        return _select_plan(shape)

    def device_apply(self, rows, members) -> None:
        # the first largest live logit, as a position mapped through the candidates (llama.cpp's device greedy
        # returns the position itself, wrong after any reordering sampler)
        rows.select(rows.first_max())


class SeededSampler(Sampler):
    """A sampler with llama.cpp's seed handling: DEFAULT_SEED resolves to a random seed, again on reset."""

    def __init__(self, seed: int) -> None:
        self.seed = check_seed(seed)
        self.seed_cur = resolve_seed(self.seed)
        self.rng = LlamaRng(self.seed_cur)

    def reset(self) -> None:
        self.seed_cur = resolve_seed(self.seed)
        self.rng.seed(self.seed_cur)

    def clone(self) -> Sampler:
        other = super().clone()
        other.rng = self.rng.clone()
        return other


class Dist(Watched, SeededSampler):
    """Draws a token from the softmax of the logits, exactly as llama.cpp's dist sampler (one double per draw)."""

    name = "dist"
    effect = SELECTOR

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed)

    def params(self) -> dict:
        return {"seed": self.seed}

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if n == 0:
            c.selected = -1
            return
        if n == 1:
            self.rng.uniform_double()  # keeps the stream aligned with the device path, as llama.cpp does
            c.set_probs(np.ones(1, dtype=F32))
            c.selected = 0
            return
        x = c.logits
        i, probs = self.draw(x, x[0] if c.sorted else c.max_logit)
        c.set_probs(probs)
        c.selected = i

    def draw(self, x: np.ndarray, m: np.float32) -> tuple[int, Callable[[], np.ndarray]]:
        """The draw over ``len(x) >= 2`` logits with maximum ``m``: the selected position, and a function
        computing the probabilities (often unused, so computed on first read)."""
        if m == -np.inf:
            raise ValueError("dist: every candidate is masked (-inf); nothing can be drawn")
        e = expf_rel(np.subtract(x, m))
        return self.draw_from(e, running_sum_f64(e))

    def draw_from(self, e: np.ndarray, run: np.ndarray | list[float], n: int | None = None
                  ) -> tuple[int, Callable[[], np.ndarray]]:
        """:meth:`draw` from ``e = expf_rel(x - m)``, the binary32 exponentials relative to the maximum, and
        ``run = running_sum_f64(e)``, their binary64 running sums (an array, or for a few, a list), over their
        first ``n`` entries (all by default; a running sum's prefix is the running sum of the prefix)."""
        if n is None:
            n = len(e)
        total = float(run[n - 1])
        target = total * self.rng.uniform_double()
        # First running sum >= target. A draw of exactly 0 would pick index 0 even with p = 0 in llama.cpp
        # (its test is sum_run >= sum_tgt); searching strictly above 0 skips zero-probability entries instead.
        if type(run) is list:
            i = (bisect_left if target > 0.0 else bisect_right)(run, target, 0, n)
        else:
            i = int(run[:n].searchsorted(target, side="left" if target > 0.0 else "right"))
        return (i if i < n else n - 1), lambda: np.true_divide(e[:n], total, dtype=F64).astype(F32)

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        return _select_plan(shape)

    def device_input(self) -> tuple[float, float]:
        """The draw apply() would make, from this row's own generator, as ``(u - margin, u + margin)``."""
        u = self.rng.uniform_double()
        return u - _DRAW_MARGIN, u + _DRAW_MARGIN

    def device_apply(self, rows, members) -> None:
        """The draw as a search for u among the running sums divided by the total: llama.cpp selects the first
        running sum >= total * u. The sums here are of binary64 exponentials (narrow sorted rows) or of torch's
        binary32 ones (within two ulps of expf): within 2**-21 of the CPU's ratios. A row with a ratio within
        ``_DRAW_MARGIN`` of u is redone on the CPU. One candidate: the CPU still draws, and the search selects
        it."""
        import torch

        from samplechain.rows import F64

        u = rows.step_input()  # [B, 2] float64: u - margin, u + margin
        if rows.sorted:  # prefix form: the first candidate is the largest
            run = torch.exp((rows.logits - rows.first()).to(F64)).cumsum(1)
            total = rows.at_last(run)
            rows.flag(total.isnan())  # every candidate -inf: the CPU chain raises
        else:  # removed entries are -inf: they add nothing
            run = rows.exp_rel_fast(rows.row_max()).to(F64).cumsum(1)
            total = run[:, -1:]
            rows.flag(total == 0.0)
        idx = torch.searchsorted(run / total, u)
        rows.flag(idx.diff(dim=1))
        rows.select(idx[:, :1].clamp(max=rows.width - 1))

    def device_record(self, c: Candidates) -> None:
        """The probabilities apply() leaves: binary32 exponentials over their binary64 sum."""
        if len(c) == 1:
            c.set_probs(np.ones(1, dtype=F32))
            return
        x = c.logits
        e = expf_rel(np.subtract(x, x[0] if c.sorted else c.max_logit))
        total = float(running_sum_f64(e)[-1])
        c.set_probs(lambda: np.true_divide(e, total, dtype=F64).astype(F32))
