"""The fast CPU paths give bitwise the candidates, probabilities, selection and draws of the straightforward ones.

Two references: a plain NumPy model of llama.cpp's samplers written here (full stable sorts, binary32 sums with
``np.cumsum``, ``expf`` as the binary64 exponential rounded once), and the samplers applied one by one
(``Chain`` fuses runs such as top-k -> top-p -> min-p -> temp -> dist into one step).
"""

import copy
import math
import zlib

import numpy as np
import pytest

from samplechain import (
    Candidates,
    Chain,
    CommonSampler,
    Dist,
    DynamicTemperature,
    Greedy,
    MinP,
    SamplingParams,
    Temperature,
    TopK,
    TopP,
    Typical,
)
from samplechain.candidates import block_rows
from samplechain.rng import LlamaRng
from samplechain.samplers._ops import softmax_values, top_k_order
from samplechain.samplers.truncation import (
    min_p_descending_size,
    min_p_sorted_size,
    nucleus_size,
    nucleus_size_from_sums,
)

# logits near FLT_MAX overflow in x - max by design (as llama.cpp's float arithmetic does): NumPy's warnings are noise
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")
F32, F64 = np.float32, np.float64
FLT_MAX = float(np.finfo(F32).max)


# --- the straightforward reference -------------------------------------------------------------------------


def ref_expf(d):
    return np.exp(d.astype(F64)).astype(F32)


def ref_sum32(v):
    return np.cumsum(v, dtype=F32)[-1]  # sequential, left to right


class Ref:
    """Candidates as plain arrays, transformed sampler by sampler from the spec's definitions."""

    def __init__(self, x, ids=None, is_sorted=False):
        self.x = np.asarray(x, dtype=F32)
        self.ids = np.arange(len(self.x), dtype=np.int32) if ids is None else np.asarray(ids, dtype=np.int32)
        self.probs = None
        self.sorted = is_sorted
        self.selected = -1
        self.fast_exp = False

    def keep(self, index, is_sorted):
        self.ids, self.x = self.ids[index], self.x[index]
        if self.probs is not None:
            self.probs = self.probs[index]
        self.sorted = is_sorted

    def sort(self):
        if not self.sorted:
            self.keep(np.argsort(-self.x, kind="stable"), True)

    def top_k(self, k):
        if k <= 0 or len(self.x) == 0:
            return
        k = min(k, len(self.x))
        if self.sorted:
            self.keep(slice(0, k), True)
        else:
            self.keep(np.argsort(-self.x, kind="stable")[:k], True)

    def top_p(self, p, min_keep):
        n = len(self.x)
        if p >= 1.0 or n == 0:
            return
        e = ref_expf(self.x - (self.x[0] if self.sorted else self.x.max()))
        self.probs = e / ref_sum32(e)  # summed in the incoming order, then sorted
        self.sort()
        run = np.cumsum(self.probs, dtype=F32)
        hits = np.flatnonzero(run >= p)
        if len(hits):
            i = max(int(hits[0]), min_keep - 1)
            keep = i + 1 if i < n else n
        else:
            keep = n
        self.keep(slice(0, keep), True)

    def min_p(self, p, min_keep):
        if p <= 0.0 or len(self.x) == 0:
            return
        log_p = F32(math.log(float(p)))
        if not self.sorted:
            idx = np.flatnonzero(self.x >= self.x.max() + log_p)
            if len(idx) and len(idx) >= min_keep:
                self.keep(idx, False)
                return
            self.sort()
        n_keep = max(int(np.count_nonzero(self.x >= self.x[0] + log_p)), 1)
        self.keep(slice(0, max(n_keep, min(min_keep, len(self.x)))), True)

    def temp(self, t):
        if len(self.x) == 0:
            return
        finite = self.x[self.x > -np.inf]
        lo = float(finite.min()) if len(finite) else 0.0
        if t > 0 and (t >= 1 or max(abs(float(self.x.max())), abs(lo)) <= FLT_MAX * float(t)):
            self.x = self.x / t
        else:
            keep = int(np.argmax(self.x))
            masked = np.full(len(self.x), -np.inf, dtype=F32)
            masked[keep] = self.x[keep]
            self.x = masked
        self.probs = None

    def dist(self, rng):
        n = len(self.x)
        if n == 0:
            self.selected = -1
            return
        u = rng.uniform_double()
        if n == 1:
            self.probs = np.ones(1, dtype=F32)
            self.selected = 0
            return
        self.fast_exp = n > 2048  # Dist's documented shortcut (expf_rel): tiny terms may be off by an ulp
        e = ref_expf(self.x - (self.x[0] if self.sorted else self.x.max()))
        run = np.cumsum(e.astype(F64))
        total = float(run[-1])
        target = total * u
        hits = np.flatnonzero(run >= target) if target > 0 else np.flatnonzero(run > 0)
        self.selected = min(int(hits[0]) if len(hits) else n - 1, n - 1)
        self.probs = (e.astype(F64) / total).astype(F32)


def ref_apply(samplers, ref):
    """The reference for a chain of TopK / TopP / MinP / Temperature / temp-ext (no range) / Dist members."""
    for s in samplers:
        if isinstance(s, TopK):
            ref.top_k(s.k)
        elif isinstance(s, TopP):
            ref.top_p(s.p, s.min_keep)
        elif isinstance(s, MinP):
            ref.min_p(s.p, s.min_keep)
        elif isinstance(s, (Temperature, DynamicTemperature)):
            assert not isinstance(s, DynamicTemperature) or s.delta <= 0
            if not s.disabled:
                ref.temp(s.t)
        elif isinstance(s, Dist):
            ref.dist(ref.rng)
        else:
            raise AssertionError(s)


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype == F32 else np.uint64).tolist() if a.dtype.kind == "f" else a.tolist()


def assert_same(c, ref):
    """Bitwise equal candidates (ids, logits incl. -0.0 and -inf, probabilities), selection and sort flag."""
    assert c.ids.dtype == np.int32 and c.logits.dtype == F32
    assert c.ids.tolist() == ref.ids.tolist()
    assert bits(c.logits) == bits(ref.x)
    assert c.selected == ref.selected and c.sorted == ref.sorted
    if ref.probs is not None:
        assert c.probs is not None and c.probs.dtype == F32
        if ref.fast_exp:
            np.testing.assert_allclose(c.probs, ref.probs, rtol=1e-6, atol=2.0**-126)
        else:
            assert bits(c.probs) == bits(ref.probs)


def check_against_reference(make, x, seed=1234, steps=2):
    """A chain from ``make(seed)`` sampling ``x`` ``steps`` times equals the reference at every step."""
    chain = Chain(make(seed))
    ref_samplers = make(seed)
    rng = LlamaRng(seed)
    for _ in range(steps):
        c = Candidates.from_logits(x)
        chain.apply(c)
        ref = Ref(x)
        ref.rng = rng
        ref_apply(ref_samplers, ref)
        assert_same(c, ref)
        chain.accept(int(c.ids[c.selected]))


def one_by_one(samplers, c):
    for s in samplers:
        s.apply(c)
    return c


def check_fused_equals_one_by_one(make, c_make, steps=2):
    """``Chain.apply`` (fused) and the members' own ``apply`` one after the other agree bitwise, draws included."""
    fused, plain = Chain(make()), make()
    for _ in range(steps):
        a, b = c_make(), c_make()
        errors = []
        for run in (lambda a=a: fused.apply(a), lambda b=b: one_by_one(plain, b)):
            try:
                run()
                errors.append(None)
            except ValueError as e:  # e.g. dist over candidates whose first (sorted) logit is -inf
                errors.append(str(e))
        assert errors[0] == errors[1]
        if errors[0] is not None:
            return
        assert a.ids.tolist() == b.ids.tolist() and bits(a.logits) == bits(b.logits)
        assert a.selected == b.selected and a.sorted == b.sorted
        pa, pb = a.probs, b.probs
        assert (pa is None) == (pb is None)
        if pa is not None:
            assert bits(pa) == bits(pb)
    # the generators advanced alike
    assert [s.rng.next_u32() for s in fused if hasattr(s, "rng")] == [s.rng.next_u32() for s in plain
                                                                      if hasattr(s, "rng")]


def realistic(n, seed, heads=40):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 2.5, n).astype(F32)
    h = min(heads, n)
    head = rng.choice(n, h, replace=False)
    x[head] += rng.uniform(6.0, 14.0, h).astype(F32)
    return x


def default_chain(seed):
    return list(CommonSampler(SamplingParams(seed=seed)).chain)


def adversarial(kind, n, seed):
    """Logits that stress ties, masking, overflow and underflow."""
    rng = np.random.default_rng(seed)
    if kind == "realistic":
        return realistic(n, seed)
    if kind == "flat":
        return rng.uniform(-1, 1, n).astype(F32)
    if kind == "ties":  # few distinct values: ties everywhere, also across the top-k boundary
        return np.round(rng.normal(0, 2, n), 0).astype(F32)
    if kind == "all_equal":
        return np.full(n, 0.5, dtype=F32)
    if kind == "masked":  # most entries -inf
        x = np.full(n, -np.inf, dtype=F32)
        live = rng.choice(n, max(1, n // 50), replace=False)
        x[live] = rng.normal(0, 3, len(live)).astype(F32)
        return x
    if kind == "one_live":
        x = np.full(n, -np.inf, dtype=F32)
        x[rng.integers(n)] = 3.0
        return x
    if kind == "huge":  # |logit| near FLT_MAX: a temperature below 1 would overflow
        x = rng.uniform(-1, 1, n).astype(F32) * F32(3e38)
        return x
    if kind == "spread":  # exponentials down to subnormals and zero
        return (-rng.uniform(0, 200, n)).astype(F32)
    if kind == "signed_zeros":
        x = np.zeros(n, dtype=F32)
        x[rng.random(n) < 0.5] = F32(-0.0)
        x[rng.integers(n)] = 1.0
        return x
    raise AssertionError(kind)


KINDS = ["realistic", "flat", "ties", "all_equal", "masked", "one_live", "huge", "spread", "signed_zeros"]


# --- exact values on hand-checkable inputs -------------------------------------------------------------------

P4 = np.log(np.array([0.1, 0.2, 0.3, 0.4], dtype=F32))


@pytest.mark.parametrize("members, ids, probs", [
    # llama.cpp's tests/test-sampling.cpp cases top_k 3, top_p 0.7, top_p 0.8 and min_p 0.26, here through the
    # fused step
    (lambda: [TopK(3), Dist(0)], [3, 2, 1], [0.4444444477558136, 0.3333333134651184, 0.2222222238779068]),
    (lambda: [TopK(4), TopP(0.7), Dist(0)], [3, 2], [0.5714285969734192, 0.4285714030265808]),
    (lambda: [TopK(40), TopP(0.8), Dist(0)], [3, 2, 1], [0.4444444477558136, 0.3333333134651184, 0.2222222238779068]),
    (lambda: [TopK(4), MinP(0.26), Dist(0)], [3, 2, 1], [0.4444444477558136, 0.3333333134651184, 0.2222222238779068]),
    # logits / 0.8 over all four: p_i = 0.1^1.25... normalised
    (lambda: [TopK(4), TopP(0.95), MinP(0.05), Temperature(0.8), Dist(0)], [3, 2, 1, 0],
     [0.43569597601890564, 0.3040955662727356, 0.1831875741481781, 0.07702089101076126]),
])
def test_fused_chain_exact_values(members, ids, probs):
    c = Candidates.from_logits(P4)
    Chain(members()).apply(c)
    assert c.ids.tolist() == ids and c.sorted
    assert c.probs.tolist() == probs  # binary32 values, written out exactly
    # seed 0's first draw is 0.59284461651668263: the running sum first reaches it at the second candidate
    assert c.selected == 1 and c.token == ids[1]


@pytest.mark.parametrize("n, tokens", [
    (49152, [1357, 1357, 1357, 1357, 34125]), (262144, [143256, 85260, 143155, 143155, 85260]),
])
def test_default_chain_exact_tokens_at_both_vocab_sizes(n, tokens):
    """llama.cpp's default chain, seed 1234: the tokens llama.cpp (llama-cpp-python 0.3.36) draws for these
    logits, and every step equal to the reference."""
    x = realistic(n, 11)
    chain = Chain(default_chain(1234))
    assert [chain.sample(x) for _ in range(5)] == tokens
    check_against_reference(default_chain, x, steps=5)


# --- against the reference -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [49152, 262144, 50000, 131072 + 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_chain_equals_reference_on_realistic_logits(n, seed):
    check_against_reference(default_chain, realistic(n, seed), seed=seed, steps=3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 3, 40, 41, 1000, 5000, 49152])
def test_default_chain_equals_reference_on_adversarial_logits(kind, n):
    check_against_reference(default_chain, adversarial(kind, n, n), steps=2)


CHAINS = {
    "top-k + dist": lambda k, p, mp, mk, t: lambda s: [TopK(k), Dist(s)],
    "top-k top-p dist": lambda k, p, mp, mk, t: lambda s: [TopK(k), TopP(p, mk), Dist(s)],
    "top-k min-p temp dist": lambda k, p, mp, mk, t: lambda s: [TopK(k), MinP(mp, mk), Temperature(t), Dist(s)],
    "full": lambda k, p, mp, mk, t: lambda s: [TopK(k), TopP(p, mk), MinP(mp, mk), DynamicTemperature(t, 0, 1),
                                               Dist(s)],
    "no top-k": lambda k, p, mp, mk, t: lambda s: [TopP(p, mk), MinP(mp, mk), Temperature(t), Dist(s)],
    "min-p temp dist": lambda k, p, mp, mk, t: lambda s: [MinP(mp, mk), Temperature(t), Dist(s)],
}


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("kind", KINDS)
def test_chains_equal_reference_over_parameters(chain, kind):
    rng = np.random.default_rng(zlib.crc32(f"{chain}/{kind}".encode()))  # the same cases in every run
    for _ in range(12):
        n = int(rng.choice([1, 2, 5, 40, 300, 1025, 4096, 20000]))
        k = int(rng.choice([1, 2, 7, 40, 100, n, n + 5, 0, -1]))  # beyond the vocabulary, disabled
        p = float(rng.choice([0.0, 0.3, 0.9, 0.95, 0.999999, 1.0]))
        mp = float(rng.choice([0.0, 0.01, 0.05, 0.5, 1.0, 1.5]))
        mk = int(rng.choice([0, 1, 3, 50]))
        t = float(rng.choice([0.0, -1.0, 0.25, 0.8, 1.0, 1.7]))
        x = adversarial(kind, n, int(rng.integers(1 << 30)))
        make = CHAINS[chain](k, p, mp, mk, t)
        check_against_reference(make, x, seed=int(rng.integers(1 << 31)), steps=2)


@pytest.mark.slow  # 450 chains on 49,152 logits
def test_top_p_cut_exactly_at_a_running_sum():
    """p equal to (or one ulp around) a binary32 running sum: the f64 shortcut must defer to the f32 sums."""
    for seed in range(30):
        x = realistic(49152, seed)
        order = np.argsort(-x, kind="stable")[:40]
        xs = x[order]
        e = ref_expf(xs - xs[0])
        run = np.cumsum(e / ref_sum32(e), dtype=F32)
        for i in (0, 1, 5, 17, 30):
            for p in (run[i], np.nextafter(run[i], F32(0)), np.nextafter(run[i], F32(2))):
                if not 0 < p < 1:
                    continue
                make = lambda s, p=p: [TopK(40), TopP(p), MinP(0.001), Temperature(0.7), Dist(s)]  # noqa: E731
                check_against_reference(make, x, seed=seed, steps=1)


# --- the fused step against the members one by one (covers what the reference does not) -----------------------


@pytest.mark.parametrize("kind", KINDS)
def test_fused_equals_one_by_one(kind):
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.choice([1, 2, 5, 40, 300, 3000, 49152]))
        x = adversarial(kind, n, int(rng.integers(1 << 30)))
        seed = int(rng.integers(1 << 31))
        k = int(rng.choice([1, 3, 40, n + 1, 0]))
        t, delta = float(rng.choice([0.0, 0.5, 0.8, 1.0])), float(rng.choice([0.0, 0.0, 0.5]))
        p, mp, mk = float(rng.choice([0.5, 0.95, 1.0])), float(rng.choice([0.0, 0.05, 2.0])), int(rng.choice([0, 4]))
        make = lambda: [TopK(k), TopP(p, mk), MinP(mp, mk), DynamicTemperature(t, delta, 1.0), Dist(seed)]  # noqa
        check_fused_equals_one_by_one(make, lambda x=x: Candidates.from_logits(x))


def test_fused_equals_one_by_one_on_sorted_input_that_is_not_descending():
    """The sorted flag without descending logits (e.g. after a grammar masked entries of a sorted set)."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        x = np.sort(rng.normal(0, 3, n).astype(F32))[::-1].copy()
        x[rng.random(n) < 0.3] = -np.inf
        ids = rng.permutation(1000)[:n]
        seed = int(rng.integers(1 << 31))
        for make in (lambda s=seed: [TopK(30), TopP(0.9), MinP(0.05), Temperature(0.8), Dist(s)],
                     lambda s=seed: [TopP(0.9), MinP(0.05, 3), Dist(s)]):
            if np.isfinite(x).any():
                check_fused_equals_one_by_one(make, lambda i=ids, x=x: Candidates.from_arrays(i, x, sorted=True))


def test_fused_run_with_placeholders_and_dynamic_temperature():
    x = realistic(49152, 4)
    for make in (
        lambda: [TopK(40), TopP(1.0), MinP(0.0), Temperature(1.0), Dist(5)],  # every filter a placeholder
        lambda: [TopK(0), TopP(0.9), Dist(5)],  # top-k disabled: unsorted input goes one by one
        lambda: [TopK(40), TopP(0.9), MinP(0.05), DynamicTemperature(0.8, 0.5, 1.0), Dist(5)],
        lambda: [TopK(40), TopP(0.9), MinP(0.05), DynamicTemperature(0.0, 0.0, 1.0), Dist(5)],  # greedy
        lambda: [TopK(40), Temperature(-1.0), Dist(5)],
        lambda: [TopK(40), Typical(0.9), TopP(0.9), Dist(5)],  # typical breaks the run
        lambda: [TopK(40), Dist(5), TopK(3), Dist(6)],  # two runs
    ):
        check_fused_equals_one_by_one(make, lambda: Candidates.from_logits(x), steps=3)


def test_fused_run_with_probabilities_already_written():
    x = realistic(5000, 9)

    def with_probs():
        c = Candidates.from_logits(x)
        softmax_values(c.logits, c.max_logit)
        c.set_probs(np.full(len(x), 0.5, dtype=F32))
        return c

    check_fused_equals_one_by_one(lambda: [TopK(40), TopP(0.9), Dist(2)], with_probs)


def test_empty_candidates_select_nothing():
    c = Candidates.from_arrays([], [])
    Chain([TopK(4), TopP(0.9), Dist(1)]).apply(c)
    assert c.selected == -1 and len(c) == 0


def test_all_masked_raises_like_dist():
    x = np.full(100, -np.inf, dtype=F32)
    with pytest.raises(ValueError, match="masked"):
        Chain([TopK(40), TopP(0.9), Dist(1)]).sample(x)
    with pytest.raises(ValueError, match="masked"):
        one_by_one([TopK(40), TopP(0.9), Dist(1)], Candidates.from_logits(x))


def test_nan_and_inf_are_rejected_before_any_sampler():
    for bad in (np.nan, np.inf):
        for n in (10, 49152, 49152 + 7):
            x = realistic(n, 1)
            x[n - 1] = bad  # in the tail past the block grid when n is not a multiple of its rows
            with pytest.raises(ValueError, match="NaN" if bad != np.inf else r"\+inf"):
                Chain(default_chain(1)).sample(x)


# --- the pieces ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4096, 49152, 49152 + 13, 131040, 131071, 133056, 262144, 262144 + 63])
@pytest.mark.parametrize("kind", ["realistic", "ties", "masked", "all_equal", "signed_zeros"])
def test_top_k_order_is_the_stable_sort(n, kind):
    x = adversarial(kind, n, n)
    for k in (1, 8, 40, 100, 500):
        c = Candidates.from_logits(x)
        positions, values = top_k_order(c, k)
        expected = np.argsort(-x, kind="stable")[:k]
        assert positions.tolist() == expected.tolist()
        assert bits(values) == bits(x[expected])


def test_top_k_ties_across_columns_keep_lowest_positions():
    n = 49152
    cols = n // block_rows(n)
    x = np.zeros(n, dtype=F32)
    x[[5, 5 + cols, 7 * cols + 2, 3]] = 2.0  # ties inside one column and across columns
    c = Candidates.from_logits(x)
    assert top_k_order(c, 3)[0].tolist() == [3, 5, 5 + cols]


def test_nucleus_from_sums_agrees_or_defers():
    rng = np.random.default_rng(0)
    decided = 0
    for _ in range(3000):
        n = int(rng.integers(1, 80))
        xs = np.sort(rng.normal(0, float(rng.choice([0.1, 1, 4])), n).astype(F32))[::-1]
        e = ref_expf(xs - xs[0])
        q = np.cumsum(e.astype(F64)).tolist()
        probs = e / ref_sum32(e)
        run = np.cumsum(probs, dtype=F32)
        i = int(rng.integers(n))
        p = F32(rng.choice([run[i], np.nextafter(run[i], F32(0)), np.nextafter(run[i], F32(2)), rng.random()]))
        mk = int(rng.choice([0, 1, 3, 100]))
        fast = nucleus_size_from_sums(q, p, mk)
        if fast is not None:
            decided += 1
            assert fast == nucleus_size(softmax_values(xs, xs[0]), p, mk)
    assert decided > 500  # the shortcut decides all but the cases built to sit on the boundary


def test_min_p_on_descending_logits_as_a_list():
    rng = np.random.default_rng(1)
    for _ in range(2000):
        n = int(rng.integers(1, 60))
        xs = np.sort(np.round(rng.normal(0, 2, n), 1).astype(F32))[::-1].copy()  # ties too
        xs[rng.random(n) < 0.1] = -np.inf
        xs = np.sort(xs)[::-1].copy()
        if xs[0] == -np.inf:
            continue
        log_p = F32(math.log(float(F32(rng.choice([1e-4, 0.05, 0.5, 1.0, 1.7])))))
        mk = int(rng.choice([0, 1, 3, 100]))
        assert min_p_descending_size(xs.tolist(), log_p, mk) == min_p_sorted_size(xs, log_p, mk)


def test_uniform_double_across_a_block_boundary():
    """Two-word draws that straddle the generator's 624-word blocks equal the word stream."""
    a, b = LlamaRng(99), np.random.RandomState(99)
    words = [int(w) for w in b.randint(0, 2**32, size=2000, dtype=np.uint64)]
    assert a.uniform_float() == F32(words[0]) / F32(2**32)
    pos = 1
    for _ in range(900):
        u = a.uniform_double()
        assert u == float(words[pos] | (words[pos + 1] << 32)) / 2.0**64
        pos += 2


# --- the chain's plan -------------------------------------------------------------------------------------------


def test_plan_follows_changes_to_the_member_list():
    x = realistic(49152, 2)
    chain = Chain([TopK(40), Dist(3)])
    chain.sample(x)
    chain.samplers[1] = Greedy()  # the public list changed: the next call sees it
    c = Candidates.from_logits(x)
    chain.apply(c)
    assert c.token == int(np.argmax(x)) and len(c) == 40
    chain.samplers.insert(1, TopK(5))
    c = Candidates.from_logits(x)
    chain.apply(c)
    assert len(c) == 5


def test_accept_reaches_members_with_accept_only_and_counts():
    from samplechain import Penalties

    pen = Penalties(8, 1.0, 0.0, 5.0)
    chain = Chain([pen, TopK(40), Dist(3)])
    chain.accept(7)
    chain.accept(7)
    assert pen._counts.get(7) == 2 and chain.perf.n_sample == 2


def test_copies_of_a_chain_do_not_share_the_plan():
    """A copy's plan uses the copy's members (a shared generator would change the copy's tokens)."""
    x = realistic(49152, 5)
    chain = Chain(default_chain(8))
    chain.sample(x)
    twins = [copy.deepcopy(chain), chain.clone()]
    expected = [chain.sample(x) for _ in range(4)]
    for twin in twins:
        assert [twin.sample(x) for _ in range(4)] == expected
