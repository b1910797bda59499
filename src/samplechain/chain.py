"""``Chain``: samplers applied in order, with accept fan-out, reset, clone and perf counters (llama.cpp's
``llama_sampler_chain_*``, src/llama-sampler.cpp)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from samplechain import _native
from samplechain.candidates import Candidates
from samplechain.samplers._ops import softmax_values, top_k_order
from samplechain.samplers.base import Sampler, changes
from samplechain.samplers.probability_filters import (
    MinP,
    TopP,
    min_p_descending_size,
    min_p_sorted_size,
    nucleus_size,
    nucleus_size_from_sums,
)
from samplechain.samplers.selectors import Dist, Greedy
from samplechain.samplers.temperature import DynamicTemperature, Temperature, divides
from samplechain.samplers.truncation import TopK


@dataclass
class PerfCounters:
    """llama.cpp's sampler perf data: time in apply + accept, and the number of accepts."""

    t_sample_ms: float = 0.0
    n_sample: int = 0


class Chain(Sampler):
    """An ordered list of samplers that acts as one sampler."""

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = (), *, perf: bool = False) -> None:
        self.samplers: list[Sampler] = []
        for s in samplers:
            self.add(s)
        self.perf_enabled = perf
        self._t_us = 0.0
        self._n_sample = 0
        self._plan_for: list[Sampler] = []  # the members the plan below was made for
        self._steps: list[Callable[[Candidates], None]] = []
        self._acceptors: list[Sampler] = []
        self._whole: _FusedTail | _NativeGreedy | None = None  # the compiled form of a chain of one step

    def add(self, sampler: Sampler) -> None:
        if not isinstance(sampler, Sampler):
            raise ValueError(f"a chain holds samplers, got {type(sampler).__name__}")
        self.samplers.append(sampler)

    def remove(self, i: int) -> Sampler:
        return self.samplers.pop(i)

    def __getitem__(self, i: int) -> Sampler:
        return self.samplers[i]

    def __len__(self) -> int:
        return len(self.samplers)

    def __iter__(self) -> Iterator[Sampler]:
        return iter(self.samplers)

    def _plan(self) -> list[Callable[[Candidates], None]]:
        """The apply steps, (re)made when the members changed (``samplers`` is a public list): a fusable run
        of members becomes one step (see below), and only members with an ``accept`` are told of tokens."""
        samplers = self.samplers
        if self._plan_for != samplers:  # by identity: samplers define no equality
            self._plan_for = list(samplers)
            self._steps = _steps(self._plan_for)
            step = self._steps[0] if len(self._steps) == 1 else None
            self._whole = step if type(step) is _FusedTail else (
                _GREEDY if len(samplers) == 1 and type(samplers[0]) is Greedy else None)
            self._acceptors = [s for s in samplers if type(s).accept is not Sampler.accept or "accept" in vars(s)]
        return self._steps

    def apply(self, c: Candidates) -> None:
        t0 = time.perf_counter() if self.perf_enabled else 0.0
        for step in self._plan():
            step(c)
        if self.perf_enabled:
            self._t_us += (time.perf_counter() - t0) * 1e6

    def accept(self, token: int) -> None:
        t0 = time.perf_counter() if self.perf_enabled else 0.0
        self._plan()
        for s in self._acceptors:
            s.accept(token)
        if self.perf_enabled:
            self._t_us += (time.perf_counter() - t0) * 1e6
        self._n_sample += 1

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def __getstate__(self) -> dict:
        # the plan holds functions bound to these members: a copy makes its own from its own members
        return {**self.__dict__, "_plan_for": [], "_steps": [], "_acceptors": [], "_whole": None}

    def clone(self) -> Chain:
        return Chain((s.clone() for s in self.samplers), perf=self.perf_enabled)

    def sample(self, logits: np.ndarray | Iterable[float]) -> int:
        """Build candidates from ``logits``, apply the chain, accept the selected token and return it."""
        perf = self.perf_enabled
        t0 = time.perf_counter() if perf else 0.0
        steps = self._plan()
        whole = self._whole
        # one compiled call where it can (the same token and draws as the steps), else the steps
        token = -1 if whole is None else whole.sample(logits, None)
        if token < 0:
            c = Candidates.from_logits(logits)
            for step in steps:  # apply() and accept() in one, as this is the per-token path
                step(c)
            selected = c.selected
            if not 0 <= selected < len(c):
                raise ValueError(f"no sampler selected a token ({self.describe()}); end the chain with a selector")
            token = int(c.ids[selected])
        for s in self._acceptors:
            s.accept(token)
        if perf:
            self._t_us += (time.perf_counter() - t0) * 1e6
        self._n_sample += 1
        return token

    def select_whole(self, logits: object) -> tuple[int, Callable[[], Candidates]] | None:
        """:meth:`apply` on fresh candidates of ``logits`` in one compiled call, where the chain is one fused step
        and that applies: the selected token (not accepted) and a function building the candidates the members
        would leave (probabilities included); None otherwise (use :meth:`apply`)."""
        if self.perf_enabled or type(logits) is not np.ndarray:
            return None
        self._plan()
        whole = self._whole
        if type(whole) is not _FusedTail:
            return None
        top_k = whole.top_k
        k_on = top_k is not None and not top_k.disabled
        width = min(top_k.k if k_on else _NATIVE_MAX_K, logits.size)  # type: ignore[union-attr]
        if width > _NATIVE_MAX_K:  # the compiled step declines
            return None
        out = np.empty(2 + 3 * width, dtype=np.int32)
        token = whole.sample(logits, out)
        if token < 0:
            return None
        return token, lambda: _FusedTail.candidates_from(out, k_on)

    @property
    def perf(self) -> PerfCounters:
        return PerfCounters(self._t_us / 1000.0, max(0, self._n_sample))

    def perf_reset(self) -> None:
        self._t_us = 0.0
        self._n_sample = 0

    @property
    def seed(self) -> int | None:
        """The effective seed of the last seeded dist/mirostat member (llama.cpp's ``get_seed``), else None."""
        for s in reversed(self.samplers):
            if s.name in ("dist", "mirostat", "mirostat-v2"):
                return s.seed_cur
        return None

    def describe(self) -> str:
        return " -> ".join(["logits"] + [s.display_name for s in self.samplers])

    def __repr__(self) -> str:
        return f"Chain([{', '.join(map(repr, self.samplers))}])"


# --- fused runs ----------------------------------------------------------------------------------------------
#
# A run of  [top-k] [top-p] [min-p] [temp | temp-ext without dynamic range] dist  (each but dist optional, at
# least two members) is applied as one step over plain arrays: after top-k sorts, the tail works on a few dozen
# candidates, where the per-call costs of NumPy and of updating Candidates after every sampler dominate. The
# step uses the samplers' own arithmetic (top_k_order, softmax_values, nucleus_size, min_p_sorted_size,
# divides, Dist.draw) or equivalents proven equal on the inputs they get (nucleus_size_from_sums,
# min_p_descending_size, Dist.draw_from, a shared exponential call), so candidates, probabilities, selection
# and random draws are bitwise those of applying the members one by one (tests/test_fused_chain.py). What it
# does not cover (unsorted input without top-k, a dynamic temperature, greedy masking, empty candidates) is
# left to the members themselves.

_STAGES = ((TopK,), (TopP,), (MinP,), (Temperature, DynamicTemperature), (Dist,))
# Up to this many candidates after top-k, top-p and dist share one exponential call (Dist.draw's expf_rel is
# the exact expf up to this size).
_SHARED_EXP_MAX = 2048
_F32 = np.float32
_F64 = np.float64
_NEG_INF = float("-inf")
_accumulate = np.add.accumulate
_FLT_MAX = float(np.finfo(_F32).max)


def _steps(samplers: list[Sampler]) -> list[Callable[[Candidates], None]]:
    steps = []
    i = 0
    while i < len(samplers):
        run: list[Sampler | None] = []
        j = i
        for kinds in _STAGES:
            if j < len(samplers) and type(samplers[j]) in kinds:
                run.append(samplers[j])
                j += 1
            else:
                run.append(None)
        if run[-1] is not None and j - i >= 2:
            steps.append(_FusedTail(*run))
            i = j
        else:
            steps.append(samplers[i].apply)
            i += 1
    return steps


class _FusedTail:
    """One step for  [top-k] [top-p] [min-p] [temperature] dist  (see above); members are read on every call,
    so changed parameters take effect as they would in the members' own ``apply``."""

    __slots__ = ("_divisors", "_params", "_rng", "_seen", "dist", "min_p", "temp", "top_k", "top_p")

    def __init__(self, top_k: TopK | None, top_p: TopP | None, min_p: MinP | None,
                 temp: Temperature | DynamicTemperature | None, dist: Dist) -> None:
        self.top_k, self.top_p, self.min_p, self.temp, self.dist = top_k, top_p, min_p, temp, dist
        self._divisors = (None, None)  # (t, [[1], [t]] in binary32)
        self._seen = -1  # samplers.base.changes when _params was made
        self._params: tuple | None = None
        self._rng = dist.rng

    def __call__(self, c: Candidates) -> None:
        n = len(c)
        top_k = self.top_k
        if top_k is not None and not top_k.disabled and n:
            k = top_k.k if top_k.k < n else n
            if not c.sorted:
                positions, x = top_k_order(c, k)
                ids = c.ids[positions] if not c.identity else (
                    positions if positions.dtype == np.int32 else positions.astype(np.int32))
                if k <= _SHARED_EXP_MAX:
                    self._descending(c, ids, x)
                    return
            else:
                ids, x = c.ids[:k], c.logits[:k]
        elif c.sorted and n:
            ids, x = c.ids, c.logits
        else:
            for s in (top_k, self.top_p, self.min_p, self.temp, self.dist):
                if s is not None:
                    s.apply(c)
            return
        self._sorted(c, ids, x)

    def sample(self, logits: object, out: np.ndarray | None) -> int:
        """The step on full-vocabulary ``logits`` in one call of the compiled step (``csrc/sampling.c``): the
        selected token, or -1 where that does not apply (no compiled step, logits that are not a binary32
        vector, k > 2048, top-p without top-k, more than 2048 min-p survivors without top-k, a dynamic
        temperature, and inputs the NumPy step handles: NaN, every candidate masked, an overflowing temperature),
        with the generator as it was. ``out``, when given (an int32 array of ``2 + 3 * min(k or 2048, len(logits))``),
        receives the candidates (:meth:`candidates_from`).

        The members' parameters are read again only when one of them was assigned (``samplers.base.changes``):
        cold, as after a forward pass, each Python operation costs microseconds."""
        seen = changes[0]
        if self._seen != seen:  # read before the members: an assignment meanwhile makes them again next time
            self._params = self._native_params()
            self._seen = seen
        params = self._params
        if params is None:
            return -1
        rng = self._rng
        at = rng._pos  # the dist generator's buffered words (rng.py): the step reads two of them
        words = rng._buf
        if at + 2 > len(words):  # one draw in 312: the words run out, the generator draws
            mark = rng.mark()
            token = params[0](logits, params[1], None, rng.uniform_double(), out)
            if token < 0:
                rng.rewind(mark)
            return token
        token = params[0](logits, params[1], words, at, out)
        if token >= 0:
            rng._pos = at + 2
        return token

    def _native_params(self) -> tuple | None:
        """(the compiled step, its parameters) for the members as they are now, or None where it does not apply."""
        native = _native.sampling()
        top_k, top_p, min_p, temp = self.top_k, self.top_p, self.min_p, self.temp
        self._rng = self.dist.rng
        p_on = top_p is not None and not top_p.disabled
        m_on = min_p is not None and not min_p.disabled
        k_on = top_k is not None and not top_k.disabled
        if native is None or not (k_on or (m_on and not p_on)):  # without top-k: min-p sorts nothing, top-p would
            return None
        t = None
        if temp is not None and not temp.disabled:
            if type(temp) is DynamicTemperature and float(temp.delta) > 0.0:
                return None
            t = float(temp.t)
        # C ints: counts past the candidates (at most 2048 there) act as the candidates' count, below 0 as 0
        return native.fused_tail, (_c_count(top_k.k) if k_on else 0, float(top_p.p) if p_on else 1.0,
                                   _c_count(top_p.min_keep) if p_on else -1, float(min_p.log_p) if m_on else 0.0,
                                   _c_count(min_p.min_keep) if m_on else -1, t)

    @staticmethod
    def candidates_from(out: np.ndarray, sorted: bool) -> Candidates:
        """The candidates :meth:`sample` wrote into ``out``, with their probabilities and selection: sorted after
        top-k, in vocabulary order after min-p alone."""
        m, selected = int(out[0]), int(out[1])
        width = (len(out) - 2) // 3
        ids = out[2:2 + m].copy()
        logits = out[2 + width:2 + width + m].view(_F32).copy()
        probs = out[2 + 2 * width:2 + 2 * width + m].view(_F32).copy()
        c = Candidates(ids, logits, probs, sorted=sorted)
        c.selected = selected
        return c

    def _sorted(self, c: Candidates, ids: np.ndarray, x: np.ndarray) -> None:
        """The members after top-k, one after the other, on candidates flagged sorted."""
        top_p, min_p = self.top_p, self.min_p
        k = len(x)
        if top_p is not None and not top_p.disabled:
            k = nucleus_size(softmax_values(x, x[0]), top_p.p, top_p.min_keep) or k
        if min_p is not None and not min_p.disabled:
            k = min_p_sorted_size(x[:k], min_p.log_p, min_p.min_keep)
        if k < len(x):
            ids, x = ids[:k], x[:k]
        temp = self.temp
        if temp is not None and not temp.disabled:
            if (type(temp) is DynamicTemperature and temp.delta > 0.0) or not divides(x, temp.t, True):
                c.replace(ids, x, sorted=True)  # dynamic temperature or greedy masking: the members finish
                temp.apply(c)
                self.dist.apply(c)
                return
            x = np.true_divide(x, temp.t)
        self._select(c, ids, x, None, None)

    def _descending(self, c: Candidates, ids: np.ndarray, x: np.ndarray) -> None:
        """The members after top-k on the at most _SHARED_EXP_MAX candidates it sorted (so in descending order),
        in few NumPy calls:

        - min-p first: over descending logits, min-p after top-p keeps min(what min-p keeps of all, top-p's
          cut), so when min-p alone keeps one candidate, top-p needs no exponentials at all;
        - top-p's exponentials ``expf(x - x[0])`` and dist's ``expf(x/t - x[0]/t)`` come from one call over
          the rows ``x / 1`` (exact) and ``x / t``, their binary64 running sums from another; dist draws from a
          prefix of its row's sums (a running sum's prefix is the running sum of the prefix), top-p's cut is
          decided from its row's (nucleus_size_from_sums), its binary32 sums computed only when too close to
          call.

        Elementwise operations throughout, so every value is the one the members compute one by one."""
        xl = x.tolist()  # scalars for the decisions; Python floats hold binary32 values exactly
        if xl[0] == _NEG_INF:  # all masked: dist raises (the members say so)
            self._sorted(c, ids, x)
            return
        top_p, min_p, temp = self.top_p, self.min_p, self.temp
        if top_p is not None and top_p.disabled:
            top_p = None
        t = None
        if temp is not None and not temp.disabled:
            t = temp.t
            tf = float(t)
            # Over all candidates, divides() implies it over any prefix (the largest magnitude cannot grow);
            # finite logits within FLT_MAX * t of 0 are its common case.
            limit = _FLT_MAX * tf
            if (type(temp) is DynamicTemperature and float(temp.delta) > 0.0) or not (
                    (1.0 > tf > 0.0 and -limit <= xl[-1] and -limit <= xl[0] <= limit) or divides(xl, t, True)):
                self._sorted(c, ids, x)
                return
        n = k = len(xl)
        if min_p is not None and not min_p.disabled:
            k = min_p_descending_size(xl, min_p.log_p, min_p.min_keep)
        rows = x
        if k > 1:
            two = t is not None and top_p is not None
            if two:
                cached_t, divisors = self._divisors
                if cached_t is not t:
                    divisors = np.array([[1.0], [t]], dtype=_F32)  # x / 1 is x, exactly
                    self._divisors = (t, divisors)
                rows = np.true_divide(x, divisors)
            elif t is not None:
                rows = np.true_divide(x, t)
            # else top-p and dist share the exponentials
            # expf and running_sum_f64, spelled out on this per-token path
            e = np.exp(np.subtract(rows, rows[:, :1] if two else rows[:1]), dtype=_F64).astype(_F32)
            q = _accumulate(e.astype(_F64), axis=-1).tolist()
            if top_p is not None:
                keep = nucleus_size_from_sums(q[0] if two else q, top_p.p, top_p.min_keep)
                if keep is None:
                    keep = nucleus_size(softmax_values(x, x[0]), top_p.p, top_p.min_keep)
                if 0 < keep < k:
                    k = keep
            if two:
                rows, e, q = rows[1], e[1], q[1]
        if k == 1:  # when min-p alone keeps one candidate, nothing was computed
            if rows is x and t is not None:
                rows = np.true_divide(x[:1], t)
            self._select(c, ids[:1], rows[:1], None, None)
            return
        c.selected, probs = self.dist.draw_from(e, q, k)
        c.replace(ids[:k] if k < n else ids, rows[:k] if k < n else rows, sorted=True)
        c.set_probs(probs)

    def _select(self, c: Candidates, ids: np.ndarray, x: np.ndarray, e: np.ndarray | None,
                q: list[float] | None) -> None:
        """Dist over sorted candidates ``x`` (with their ``e = expf(x - x[0])`` and its running sums ``q``, or
        longer ones starting with them, if known), and the result into ``c``."""
        dist = self.dist
        k = len(x)
        if k == 1:
            dist.rng.uniform_double()  # as Dist.apply: a singleton still consumes a draw
            c.replace(ids, x, np.ones(1, dtype=_F32), sorted=True)
            c.selected = 0
            return
        selected, probs = dist.draw(x, x[0]) if e is None else dist.draw_from(e, q, k)
        c.replace(ids, x, sorted=True)
        c.set_probs(probs)
        c.selected = selected


_NATIVE_MAX_K = 2048  # csrc/sampling.c's MAX_K


def _c_count(n: int) -> int:
    """A sampler's count (k, min_keep) for the compiled step's C ints, with the same effect there: counts past
    its at most _NATIVE_MAX_K candidates act alike, and so do counts <= 0."""
    return min(max(n, 0), 1 << 30)


class _NativeGreedy:
    """A chain of one greedy sampler in one call of the compiled step: the first largest logit, as ``Greedy``."""

    __slots__ = ()

    def sample(self, logits: object, out: None) -> int:
        native = _native.sampling()
        return -1 if native is None else native.first_max(logits)  # -1 / -2: NaN, +inf, not binary32 logits


_GREEDY = _NativeGreedy()
