"""Selecting samplers without their own distribution logic: greedy and dist (spec/samplers §3.1-3.2)."""

from __future__ import annotations

import numpy as np

from samplechain._numeric import F32, F64, expf_rel, running_sum_f64
from samplechain.candidates import Candidates
from samplechain.rng import DEFAULT_SEED, LlamaRng, check_seed, resolve_seed
from samplechain.samplers.base import SELECTOR, DeviceShape, Sampler

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


class Dist(SeededSampler):
    """Draws a token from the softmax of the logits, exactly as llama.cpp's dist sampler (one double per draw)."""

    name = "dist"
    effect = SELECTOR

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed)

    def _params(self) -> dict:
        return {"seed": self.seed}

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if n == 0:
            c.selected = -1
            return
        if n == 1:
            self.rng.uniform_double()  # keeps the stream aligned with the device path (spec §3.2)
            c.set_probs(np.ones(1, dtype=F32))
            c.selected = 0
            return
        x = c.logits
        m = x[0] if c.sorted else c.max_logit
        if m == -np.inf:
            raise ValueError("dist: every candidate is masked (-inf); nothing can be drawn")
        e = expf_rel(np.subtract(x, m))
        run = running_sum_f64(e)
        total = float(run[-1])
        target = total * self.rng.uniform_double()
        # First running sum >= target. A draw of exactly 0 would pick index 0 even with p = 0 in llama.cpp
        # (spec P7); searching strictly above 0 skips zero-probability entries instead.
        i = int(run.searchsorted(target, side="left" if target > 0.0 else "right"))
        c.set_probs(lambda: np.true_divide(e, total, dtype=F64).astype(F32))
        c.selected = min(i, n - 1)

    def device_plan(self, shape: DeviceShape) -> DeviceShape | None:
        return _select_plan(shape)

    def device_input(self) -> float:
        return self.rng.uniform_double()  # the draw apply() would make, from this row's own generator

    def device_apply(self, rows, members) -> None:
        import torch

        u = torch.tensor(rows.step_input(), dtype=torch.float64, device=rows.device)[:, None]
        m = rows.row_max()
        run = rows.exp_rel_fast(m).to(torch.float64).cumsum(1)
        total = run[:, -1:]
        target = total * u
        i = torch.where(target > 0.0, (run < target).sum(1, keepdim=True), (run <= 0.0).sum(1, keepdim=True))
        i = i.clamp(max=rows.width - 1)
        hit = run.gather(1, i)
        prev = torch.where(i > 0, run.gather(1, (i - 1).clamp(min=0)), 0.0)
        margin = total * _DRAW_MARGIN
        single = rows.count() == 1
        unsure = (hit - target <= margin) | (target - prev <= margin) | (m == float("-inf")) | (u == 0.0)
        rows.flag(unsure & ~single)
        rows.select(torch.where(single[:, 0], rows.first_max(), i[:, 0]))
