"""Speculative decoding's policy in the generation loop: who drafts, how long a draft may be, and the statistics.

Drafters (``samplechain.speculative``: the n-gram family, a draft model) propose tokens; the target verifies
``[id_last, d0 .. dk-1]`` in one batch with llama.cpp's sample-and-compare (``CommonSampler.sample_and_accept_n``):
every emitted token is the target's own sample from its own logits, so with batch-invariant logits the text is
exactly the text of plain decoding, for any sampler and seed, whatever the draft length.

The draft length (docs/speculative.md, "The draft length") is the smallest of three bounds:

* a window that grows while drafts are accepted (a fully accepted draft of ``k`` tokens lets the next one be ``2k``
  long, up to ``--draft-max``) and shrinks on a rejection (to the middle of what was drafted and what was accepted),
  whichever drafter drafted: it follows the text;
* the length with the most expected tokens per unit of time: with a per-token acceptance rate ``a`` (estimated per
  drafter) a draft of ``k`` tokens emits ``1 + a + ... + a^k`` tokens on average, for the price of a ``k + 1``-token
  verify batch, whose cost relative to a one-token step is measured from the engine's own forward timings as it
  runs (``MeasuredCost``). When no length beats plain decoding, nothing is drafted (a short probe now and then keeps
  the estimate alive), so open-ended text is not slowed down;
* what the drafter proposes, the room left in the context and ``n_predict``.

It is never below ``--draft-min``: a shorter draft would be dropped, and with it every later measurement.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from samplechain.candidates import Candidates
from samplechain.params import CommonSampler

START = 4  # a drafter's first window, and the length of a probe after a run of rounds that drafted nothing
MARGIN = 1.05  # drafting must beat plain decoding by this factor in expected tokens per unit of time (noise)
KEEP = 32  # forwards of one batch size remembered by ``MeasuredCost``
RECENT = 3  # one-token steps a batch is compared with (the latest ones: their median)
MEASURED = 3  # forwards of one batch size from which its own median is its cost (before: the fitted line)


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


@runtime_checkable
class CostModel(Protocol):
    """What a verify batch costs: ``ratio(n)`` is a forward of ``n`` tokens over a one-token decode step."""

    def record(self, batch: int, seconds: float) -> None:
        """A forward of ``batch`` tokens took ``seconds`` (the drafter's time for it included)."""

    def ratio(self, batch: int) -> float | None:
        """The cost of a ``batch``-token forward in one-token steps; None while it is not known."""

    def samples(self, batch: int) -> int:
        """How many forwards of ``batch`` tokens the cost of that size rests on (an exact model: any number from
        ``MEASURED`` on)."""


@dataclass
class MeasuredCost:
    """The cost of a verify batch on this machine, measured from the engine's own forwards as they run.

    Every forward is timed by the decode loop (the drafter's work for it included). A forward of ``n > 1`` tokens
    counts as its ratio to the median of the ``RECENT`` one-token steps before it: both measured under the same load
    (the machine may be shared, and its load changes within a generation), where a fastest-ever step against a batch
    timed under load would make drafting look dear. Each size keeps its last ``KEEP`` ratios and counts by their
    median (a forward slowed by a burst of load elsewhere does not move it). A size measured ``MEASURED`` times or
    more costs that median: a kernel's cost is a staircase (the AMX kernel computes 16 rows at a time: on SmolLM2 12
    to 16 tokens cost about the same, and 17 had cost a quarter more than 16 until a short last group went to the
    AVX-512 code), which no line follows. Any other size costs ``1 + slope * (n - 1)`` one-token steps, ``slope`` the
    least-squares line through (1, 1) and each size's median ratio, weighted by how many times the size was
    measured. Unknown (None) until a one-token step and a batch of two or more tokens have been timed (batches timed
    before the first step count against it): the first drafts are the measurement."""

    steps: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))  # one-token forwards, seconds
    ratios: dict[int, deque[float]] = field(default_factory=dict)  # batch size -> its forwards / recent steps
    seconds: dict[int, deque[float]] = field(default_factory=dict)  # batch size -> its forwards, seconds
    pending: list[tuple[int, float]] = field(default_factory=list)  # (size, seconds) before any one-token step
    # the fit and each size's median ratio, until the next forward is recorded
    _fit: tuple[float | None, dict[int, float]] | None = None

    def record(self, batch: int, seconds: float) -> None:
        if batch < 1 or not seconds > 0:
            return
        self._fit = None
        self.seconds.setdefault(batch, deque(maxlen=KEEP)).append(seconds)
        if batch == 1:
            self.steps.append(seconds)
            for b, s in self.pending:  # batches timed before any one-token step: against the first one
                self.ratios.setdefault(b, deque(maxlen=KEEP)).append(s / seconds)
            self.pending.clear()
        elif self.steps:
            step = statistics.median(list(self.steps)[-RECENT:])
            self.ratios.setdefault(batch, deque(maxlen=KEEP)).append(seconds / step)
        elif len(self.pending) < KEEP:
            self.pending.append((batch, seconds))

    def _fitted(self) -> tuple[float | None, dict[int, float]]:
        if self._fit is None:
            medians = {batch: statistics.median(r) for batch, r in self.ratios.items()}
            num = den = 0.0
            for batch, m in medians.items():
                x, y, w = batch - 1, m - 1.0, len(self.ratios[batch])
                num += w * x * y
                den += w * x * x
            self._fit = (max(num / den, 0.0) if den else None, medians)
        return self._fit

    @property
    def slope(self) -> float | None:
        """Each token past the first, in one-token steps (>= 0); None until measured."""
        return self._fitted()[0]

    def ratio(self, batch: int) -> float | None:
        s, medians = self._fitted()
        if s is None:
            return None
        if batch > 1 and self.samples(batch) >= MEASURED:
            return medians[batch]
        return 1.0 + s * (batch - 1)

    def samples(self, batch: int) -> int:
        return len(self.ratios.get(batch, ()))

    def describe(self) -> str:
        """The measurement in words: the most measured batch size against a one-token step (medians, ms), and the
        fitted cost of each token past the first."""
        s = self.slope
        if s is None:
            return "not measured"
        n = max(self.ratios, key=lambda b: (len(self.ratios[b]), b))
        tn, t1 = statistics.median(self.seconds[n]), statistics.median(self.steps)
        return (f"{n} tokens {1e3 * tn:.1f} ms vs 1 token {1e3 * t1:.1f} ms "
                f"({statistics.median(self.ratios[n]):.2f}x), +{s:.3f} step per token")


@dataclass(frozen=True)
class LinearCost:
    """A fixed cost model: ``n`` tokens cost ``1 + slope * (n - 1)`` one-token steps (tests, simulations)."""

    slope: float

    def record(self, batch: int, seconds: float) -> None:
        pass

    def ratio(self, batch: int) -> float | None:
        return 1.0 + self.slope * (batch - 1)

    def samples(self, batch: int) -> int:
        return MEASURED  # exact: nothing to measure


@dataclass
class DrafterStats:
    """llama.cpp's per-implementation counters, plus the policy's state for the drafter: its acceptance estimate
    and the window (the longest draft it may make next; every drafter's is set by the last verified round)."""

    drafts: int = 0          # drafts generated
    drafted: int = 0         # tokens drafted (after the length cap)
    accepted_drafts: int = 0  # drafts with at least one token accepted
    accepted: int = 0        # draft tokens accepted
    rejected_rounds: int = 0  # rounds that ended on a rejection
    window: int = START      # the adaptive policy's window

    @property
    def rate(self) -> float:
        """Per-token acceptance under a geometric model, accepted / (accepted + rejections), with an optimistic
        prior worth two observations at 3/4 (a drafter only proposes when it has a match)."""
        return (self.accepted + 1.5) / (self.accepted + self.rejected_rounds + 2)


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a round emits on average with a draft of ``k`` tokens, each accepted with probability ``rate`` given
    the ones before it: ``1 + rate + ... + rate^k`` (the target's own token ends every round)."""
    return float(sum(rate ** i for i in range(k + 1)))


@dataclass
class Speculation:
    """Drafters in priority order, the draft length limits, and the adaptive policy.

    ``n_max``: the longest draft (llama.cpp's ``--draft-max``); ``n_min``: shorter drafts are dropped
    (``--draft-min``); ``adaptive``: choose the length by the window, measured cost and acceptance (else always up
    to n_max); ``cost``: the verify cost model (measured as it runs unless one is given).
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
    cost: CostModel = field(default_factory=MeasuredCost)
    stats: dict[str, DrafterStats] = field(default_factory=dict)
    rounds: int = 0          # verification rounds
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
        window = next(iter(self.stats.values())).window if self.stats else START  # the text's window, shared
        self.stats.setdefault(drafter.name, DrafterStats(window=window))

    def begin(self, prompt: Sequence[int]) -> None:
        for d in self.drafters:
            d.begin(prompt)

    # --- the length -----------------------------------------------------------------------------------------

    def record_time(self, batch: int, seconds: float) -> None:
        """A forward of ``batch`` tokens took ``seconds`` (the decode loop reports every one, drafted or not)."""
        self.cost.record(batch, seconds)

    def best_length(self, rate: float, limit: int) -> int:
        """The draft length (0..limit) with the most expected tokens per unit of time; 0 when no length beats plain
        decoding by ``MARGIN``; ``limit`` while the verify cost is not measured yet.

        Once the best length's batch has been measured ``MEASURED`` times, a neighbouring length whose batch has not
        is returned instead until it has: the fitted line cannot see a step in the kernel's cost, so the sizes
        around the chosen one are measured rather than predicted (a few rounds, once per size)."""
        cost = self.cost
        if cost.ratio(2) is None:
            return limit
        best_k, best = 0, MARGIN
        for k in range(1, limit + 1):
            speed = expected_tokens(rate, k) / cost.ratio(k + 1)  # type: ignore[operator]
            if speed > best:
                best_k, best = k, speed
        if best_k and cost.samples(best_k + 1) >= MEASURED:
            # a neighbour not measured yet, if it may be drafted (below --draft-min a draft is dropped, so it would
            # never be measured) and is not predicted slower than plain decoding
            for k in (best_k - 1, best_k + 1):
                if (max(1, self.n_min) <= k <= limit and cost.samples(k + 1) < MEASURED
                        and expected_tokens(rate, k) > cost.ratio(k + 1)):  # type: ignore[operator]
                    return k
        return best_k

    def length(self, name: str, limit: int) -> int:
        """How many tokens drafter ``name`` may draft this round (at most ``limit``; 0: none)."""
        if not self.adaptive:
            return limit
        s = self.stats[name]
        cap = min(limit, s.window, self.best_length(s.rate, limit))
        if cap == 0:
            self._idle += 1
            if self._idle < self.probe_every:
                return 0
            cap = min(limit, START)  # a probe keeps the acceptance estimate current
        # never below --draft-min: a shorter draft would be dropped, and with it every later measurement (af4ce3c)
        return max(cap, min(self.n_min, limit))

    # --- one round ------------------------------------------------------------------------------------------

    def propose(self, history: Sequence[int], id_last: int, limit: int) -> list[int]:
        """A draft of at most ``limit`` tokens after ``id_last`` (the first drafter with a proposal wins, as
        llama.cpp's ``common_speculative_draft``, common/speculative.cpp)."""
        self._last = None
        limit = min(limit, self.n_max)
        if limit <= 0 or not self.drafters:
            return []
        for d in self.drafters:
            tokens = d.draft(history, id_last)
            if not tokens:
                continue
            tokens = tokens[:self.length(d.name, limit)]
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
        if n_drafted and n_accepted == n_drafted:  # all taken: the next draft may be twice this one
            s.window = min(max(s.window, 2 * n_accepted), max(self.n_max, 1))
        elif n_drafted:  # a rejection: halfway between what was drafted and what held
            s.window = max((n_drafted + n_accepted) // 2, 1)
        # the window follows the text, not the drafter: a copy that one drafter started another one continues at
        # the length reached (ngram-map-k's first 4 tokens, then ngram-simple's 8, not 4 again)
        for other in self.stats.values():
            other.window = s.window
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
                         f"mean accepted per draft {s.accepted / s.drafts:.2f}, "
                         f"mean draft length {s.drafted / s.drafts:.2f}")
        if any(s.drafts for s in self.stats.values()) and isinstance(self.cost, MeasuredCost):
            lines.append(f"{'verify cost':>18} = {self.cost.describe()}")
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
