"""Speculative decoding's policy in the generation loop: who drafts, how long a draft may be, and the statistics.

Drafters (``samplechain.speculative``: the n-gram family, a draft model) propose tokens; the target verifies
``[id_last, d0 .. dk-1]`` in one batch with llama.cpp's sample-and-compare (``CommonSampler.sample_and_accept_n``):
every emitted token is the target's own sample from its own logits, so with batch-invariant logits the text is
exactly the text of plain decoding, for any sampler and seed.

The draft length adapts to what a verify batch costs on this machine and to how often drafts are accepted: with a
per-token acceptance rate ``a`` (estimated per drafter) a draft of ``k`` tokens emits ``1 + a + ... + a^k`` tokens
on average, for the price of a ``k + 1``-token forward (measured as it runs). The length maximising tokens per
second wins; when no length beats plain decoding, nothing is drafted (a 1-token probe now and then keeps the
estimate alive), so open-ended text is not slowed down.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from samplechain.candidates import Candidates
from samplechain.params import CommonSampler

# before a forward of a size has been timed: each token past the first costs this share of a one-token step
# (measured 0.2-0.35 on the compiled CPU engine; a cautious start: early drafts stay short until timed)
GUESS = 0.4


@runtime_checkable
class Drafter(Protocol):
    """One sequence's draft strategy (llama.cpp's ``common_speculative`` implementations), driven by the
    verification loop (llama.cpp's ``common_speculative_begin`` / ``_draft`` / ``_accept``, common/speculative.cpp)."""

    name: str  # llama.cpp's type name, e.g. "ngram-simple"
    n_max: int  # the longest draft it can return

    def begin(self, prompt: Sequence[int]) -> None:
        """After prompt processing: index the prompt."""

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        """A draft to follow ``id_last`` (``history`` = tokens in the context, without ``id_last``); may be []."""

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        """After verification; ``is_other`` when another drafter's draft was the one verified."""


@dataclass
class DrafterStats:
    """llama.cpp's per-implementation counters, plus the acceptance estimate the policy uses."""

    drafts: int = 0          # drafts generated
    drafted: int = 0         # tokens drafted (after the length cap)
    accepted_drafts: int = 0  # drafts with at least one token accepted
    accepted: int = 0        # draft tokens accepted
    rejected_rounds: int = 0  # rounds that ended on a rejection

    @property
    def rate(self) -> float:
        """Per-token acceptance under a geometric model, accepted / (accepted + rejections), with an optimistic
        prior worth two observations at 3/4 (a drafter only proposes when it has a match)."""
        return (self.accepted + 1.5) / (self.accepted + self.rejected_rounds + 2)


@dataclass
class Speculation:
    """Drafters in priority order, the draft length limits, and the adaptive policy.

    ``n_max``: the longest draft (llama.cpp's ``--draft-max``); ``n_min``: shorter drafts are dropped
    (``--draft-min``); ``adaptive``: choose the length by measured cost and acceptance (else always up to n_max).
    """

    drafters: list[Drafter]
    n_max: int = 16
    n_min: int = 0
    adaptive: bool = True
    probe_every: int = 16
    # "compare": llama.cpp's sample-and-compare (same text as plain decoding); "sample": distribution-preserving
    # speculative sampling, for drafters that keep their distributions (a sampling draft model)
    verify: str = "compare"
    seed: int = 0
    # --spec-synth-rates / --spec-synth-len (benchmarking): position i's draft token is accepted with this
    # conditional probability instead of by comparison (``synth_probabilities``); empty: off
    synth: tuple[float, ...] = ()
    stats: dict[str, DrafterStats] = field(default_factory=dict)
    rounds: int = 0          # verification rounds
    _times: dict[int, deque] = field(default_factory=dict)  # batch size -> the last forwards' seconds
    _idle: int = 0
    _last: Drafter | None = None

    def __post_init__(self) -> None:
        if self.verify not in ("compare", "sample"):
            raise ValueError(f"verify must be 'compare' or 'sample', got {self.verify!r}")
        self.rng = np.random.default_rng(self.seed)
        if self.n_max < 0 or self.n_min < 0:
            raise ValueError(f"draft lengths must be >= 0, got n_max={self.n_max}, n_min={self.n_min}")
        if self.n_min > self.n_max:
            raise ValueError(f"draft-min {self.n_min} exceeds draft-max {self.n_max}")
        for d in self.drafters:
            self.stats.setdefault(d.name, DrafterStats())

    def add(self, drafter: Drafter) -> None:
        """One more drafter, after the others (a server slot's draft model, which outlives each task's drafters)."""
        self.drafters.append(drafter)
        self.stats.setdefault(drafter.name, DrafterStats())

    def begin(self, prompt: Sequence[int]) -> None:
        for d in self.drafters:
            d.begin(prompt)

    # --- the cost model -----------------------------------------------------------------------------------

    def record_time(self, batch: int, seconds: float) -> None:
        """A forward of ``batch`` tokens took ``seconds``. The cost of a size is the fastest of its last 32
        forwards: a busy machine only ever slows a forward down, so the minimum is the forward's own cost."""
        self._times.setdefault(batch, deque(maxlen=32)).append(seconds)

    def _time(self, batch: int) -> float | None:
        times = self._times.get(batch)
        return min(times) if times else None

    def cost(self, batch: int) -> float:
        """A forward of ``batch`` tokens relative to one token: measured, else interpolated, else a guess."""
        t1 = self._time(1)
        if t1 is None:
            return 1.0 + GUESS * (batch - 1)
        tb = self._time(batch)
        if tb is not None:
            return max(tb / t1, 1.0)
        sizes = sorted(b for b in self._times if b > 1)
        if not sizes:
            return 1.0 + GUESS * (batch - 1)
        b = min(sizes, key=lambda s: abs(s - batch))
        per_token = (self._time(b) / t1 - 1.0) / (b - 1)  # type: ignore[operator]
        return 1.0 + max(per_token, 0.0) * (batch - 1)

    def best_length(self, rate: float, limit: int) -> int:
        """The draft length with the most expected tokens per unit of time (0: plain decoding is best)."""
        best_k, best = 0, 1.0
        gain, term = 1.0, 1.0
        for k in range(1, limit + 1):
            term *= rate
            gain += term
            speed = gain / self.cost(k + 1)
            if speed > best * 1.05:  # a margin against noise in the measured costs
                best_k, best = k, speed
        return best_k

    # --- one round ------------------------------------------------------------------------------------------

    def propose(self, history: Sequence[int], id_last: int, limit: int) -> list[int]:
        """A draft of at most ``limit`` tokens after ``id_last`` (the first drafter with a proposal wins)."""
        self._last = None
        limit = min(limit, self.n_max)
        if limit <= 0 or not self.drafters:
            return []
        for d in self.drafters:
            tokens = d.draft(history, id_last)
            if not tokens:
                continue
            cap = limit
            if self.adaptive:
                cap = min(cap, self.best_length(self.stats[d.name].rate, limit))
                if cap == 0:
                    self._idle += 1
                    if self._idle < self.probe_every:
                        return []
                    cap = min(limit, 4)  # a probe keeps the acceptance estimate current
                # never below --draft-min: a shorter draft would be dropped, and with it every later measurement
                cap = max(cap, min(self.n_min, limit))
            tokens = tokens[:cap]
            if len(tokens) < max(self.n_min, 1):
                return []
            self._idle = 0
            self._last = d
            s = self.stats[d.name]
            s.drafts += 1
            s.drafted += len(tokens)
            return tokens
        return []

    def seed_synth(self, seed: int) -> None:
        """The task's seed for synthetic acceptance (llama-server seeds a ``std::mt19937`` per task with it)."""
        from samplechain.rng import resolve_seed

        self._synth_rng = np.random.RandomState(resolve_seed(seed))  # MT19937 seeded as std::mt19937::seed

    def _synth_uniform(self) -> float:
        """libstdc++'s ``uniform_real_distribution<double>(0, 1)`` over the mt19937: two 32-bit draws."""
        if not hasattr(self, "_synth_rng"):
            self.seed_synth(self.seed)
        lo, hi = self._synth_rng.randint(0, 2**32, size=2, dtype=np.uint64)
        return min((int(lo) + int(hi) * 2**32) / 2**64, 1.0 - 2**-53)

    def synth_round(self, sampler: CommonSampler, rows: Sequence[np.ndarray], draft: Sequence[int]) -> list[int]:
        """llama-server's ``server_sample_and_accept_synth``: draft token i is kept with probability ``synth[i]``
        (never an end-of-generation token), without advancing the grammar or the reasoning budget; the first one
        not kept is replaced by the target's sample, which ends the round. The target is sampled only there (the
        samples llama-server draws at kept positions are discarded unused)."""
        vocab = sampler.vocab
        out: list[int] = []
        for i, token in enumerate(draft):
            if self._synth_uniform() < self.synth[i] and not (vocab is not None and vocab.is_eog(token)):
                sampler.accept(token)
                out.append(token)
                continue
            out.append(sampler.sample(rows[i]))
            return out
        out.append(sampler.sample(rows[len(draft)]))
        return out

    def verify_round(self, sampler: CommonSampler, rows: Sequence[np.ndarray], draft: Sequence[int]) -> list[int]:
        """The tokens this round emits (1 to len(draft) + 1), accepted into ``sampler``."""
        if self.synth and draft:
            return self.synth_round(sampler, rows, draft)
        dists = getattr(self._last, "distributions", None)
        if self.verify == "sample" and draft and dists is not None:
            return speculative_sample(sampler, rows, draft, dists[: len(draft)], self.rng)
        return sampler.sample_and_accept_n(list(rows), draft)

    def accept(self, n_drafted: int, n_accepted: int) -> None:
        """After verification: ``n_accepted`` of the ``n_drafted`` proposed tokens were accepted."""
        self.rounds += 1
        d = self._last
        if d is None:
            return
        s = self.stats[d.name]
        s.accepted += n_accepted
        s.accepted_drafts += n_accepted > 0
        s.rejected_rounds += n_accepted < n_drafted
        for other in self.drafters:
            other.accept(n_accepted, is_other=other is not d)

    def report(self) -> str:
        """llama.cpp-style statistics: drafted, accepted, acceptance rate, per drafter."""
        lines = []
        for name, s in self.stats.items():
            if s.drafts == 0:
                lines.append(f"{'speculative':>18} = {name}: no drafts")
                continue
            lines.append(f"{'speculative':>18} = {name}: {s.drafts} drafts, {s.drafted} tokens drafted, "
                         f"{s.accepted} accepted ({100 * s.accepted / max(s.drafted, 1):.1f} %), "
                         f"mean accepted per draft {s.accepted / s.drafts:.2f}")
        return "\n".join(lines)


# --- distribution-preserving verification (examples/speculative/speculative.cpp's, residual per token id) -------

def target_distribution(sampler: CommonSampler, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, probs)``: what ``sampler`` would draw its next token from. Its stages (the reasoning budget, the
    grammar masking first, the chain) but the final selector are applied; the selector's distribution is the
    softmax of what is left (``dist``) or the top token (``greedy``)."""
    chain = sampler.samplers
    final = chain[-1].name if chain else ""
    if final not in ("dist", "greedy"):
        raise ValueError(f"speculative sampling needs a chain ending in dist or greedy, not {final or 'nothing'}")
    c = Candidates.from_logits(logits)
    for s in sampler.stages(with_grammar=True)[:-1]:  # every stage but the final selector
        if not s.disabled:
            s.apply(c)
    ids, x = c.ids.astype(np.int64), c.logits.astype(np.float64)
    live = np.isfinite(x)
    ids, x = ids[live], x[live]
    if ids.size == 0:
        raise ValueError("no candidate left to sample from")
    if final == "greedy":
        best = int(np.lexsort((ids, -x))[0])
        return ids[best:best + 1], np.ones(1)
    p = np.exp(x - x.max())
    return ids, p / p.sum()


def _draw(rng: np.random.Generator, ids: np.ndarray, probs: np.ndarray) -> int:
    return int(ids[min(int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right")),
                       ids.size - 1)])


def speculative_sample(sampler: CommonSampler, rows: Sequence[np.ndarray], draft: Sequence[int],
                       draft_dists: Sequence[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator) -> list[int]:
    """Leviathan et al.'s rule: accept ``draft[i]`` with probability ``min(1, p(x) / q(x))``; at the first
    rejection draw from ``max(0, p - q)`` normalised over the union of both candidate sets (llama.cpp subtracts
    index-wise, assuming both lists hold the same ids in the same order) and stop; after ``k`` acceptances draw the
    bonus token from the target. Every emitted token is accepted into ``sampler``; each step uses one uniform for
    the test and one more only for a residual or bonus draw. The emitted tokens follow the target's distribution
    exactly, whatever the draft's."""
    if len(rows) != len(draft) + 1 or len(draft_dists) != len(draft):
        raise ValueError("need len(draft) + 1 logits rows and one draft distribution per draft token")
    out: list[int] = []
    for i, x in enumerate(draft):
        ids, p = target_distribution(sampler, rows[i])
        q_ids, q = draft_dists[i]
        px = float(p[ids == x].sum())
        qx = float(q[q_ids == x].sum())
        if qx <= 0:
            raise ValueError(f"draft token {x} has probability 0 under its own draft distribution")
        if rng.random() < min(1.0, px / qx):
            out.append(int(x))
            sampler.accept(int(x), is_generated=True)
            continue
        union = np.union1d(ids, q_ids)
        residual = np.zeros(union.size)
        residual[np.searchsorted(union, ids)] += p
        residual[np.searchsorted(union, q_ids)] -= q
        residual = np.maximum(residual, 0.0)
        token = _draw(rng, union, residual) if residual.sum() > 0 else _draw(rng, ids, p)
        out.append(token)
        sampler.accept(token, is_generated=True)
        return out
    ids, p = target_distribution(sampler, rows[len(draft)])
    token = _draw(rng, ids, p)
    out.append(token)
    sampler.accept(token, is_generated=True)
    return out


def synth_probabilities(rates: Sequence[float] | None, length: float | None, n_max: int) -> tuple[float, ...]:
    """``--spec-synth-rates`` / ``--spec-synth-len`` resolved as llama.cpp's ``common_speculative_synth_rates_resolve``
    (unconditional per-position rates, or the geometric rates whose mean acceptance length is ``length``), returned
    as the conditional probabilities the verification draws against (rate i / rate i-1). ValueError with
    llama.cpp's messages."""
    if rates is None and length is None:
        return ()
    if rates is not None and length is not None:
        raise ValueError("synthetic acceptance length and rates are mutually exclusive")
    if n_max <= 0:
        raise ValueError("synthetic acceptance requires at least one speculative token")
    if rates is not None:
        if len(rates) != n_max:
            raise ValueError(f"synthetic acceptance rates must contain {n_max} values, got {len(rates)}")
        for i, r in enumerate(rates):
            if not np.isfinite(r) or not 0.0 <= r <= 1.0:
                raise ValueError("synthetic acceptance rates must be finite and within [0, 1]")
            if i > 0 and r > rates[i - 1]:
                raise ValueError("synthetic acceptance rates must be monotonically non-increasing")
        resolved = list(rates)
    else:
        length_max = n_max + 1.0
        if not np.isfinite(length) or not 1.0 <= length <= length_max:
            raise ValueError(f"synthetic acceptance length must be finite and within [1, {length_max:.0f}]")
        p = 0.0
        if length == length_max:
            p = 1.0
        elif length > 1.0:
            lo, hi = 0.0, 1.0
            for _ in range(32):  # bisection: sum of p^1 .. p^n_max == length - 1
                mid = 0.5 * (lo + hi)
                total, term = 0.0, mid
                for _ in range(n_max):
                    total, term = total + term, term * mid
                if total < length - 1.0:
                    lo = mid
                else:
                    hi = mid
            p = 0.5 * (lo + hi)
        resolved, rate = [], p
        for _ in range(n_max):
            resolved.append(rate)
            rate *= p
    out, prev = [], 1.0
    for r in resolved:
        out.append(r / prev if prev > 0.0 else 0.0)
        prev = r
    return tuple(out)
