"""Property tests: any logits, any parameters — no NaN, valid selections, sizes, normalised probabilities."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from samplechain import (
    XTC,
    AdaptiveP,
    Candidates,
    Chain,
    CommonSampler,
    Dist,
    DynamicTemperature,
    Greedy,
    MinP,
    Mirostat,
    MirostatV2,
    SamplingParams,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)

finite = st.floats(-30, 30, allow_nan=False, width=32)
logits_st = arrays(np.float32, st.integers(1, 300), elements=st.one_of(finite, st.just(-np.inf))).filter(
    lambda x: np.isfinite(x).any())
prob = st.floats(0.0, 1.0, allow_nan=False)

filters = st.one_of(
    st.builds(TopK, st.integers(-2, 400)),
    st.builds(TopP, prob, st.integers(0, 5)),
    st.builds(MinP, prob, st.integers(0, 5)),
    st.builds(Typical, prob, st.integers(0, 5)),
    st.builds(TopNSigma, st.floats(-1, 4)),
    st.builds(Temperature, st.floats(-1, 3)),
    st.builds(DynamicTemperature, st.floats(0, 3), st.floats(0, 2), st.floats(0.1, 3)),
    st.builds(XTC, prob, st.floats(0, 0.6), st.integers(0, 3), st.integers(0, 2**32 - 2)),
)
selectors = st.one_of(
    st.builds(Dist, st.integers(0, 2**32 - 2)),
    st.just(Greedy()),
    st.builds(MirostatV2, st.integers(0, 2**32 - 2), st.floats(0.5, 10), st.floats(0.01, 1)),
    st.builds(AdaptiveP, st.floats(-1, 1), st.floats(0, 0.99), st.integers(0, 2**32 - 2)),
)


@settings(max_examples=300, deadline=None)
@given(logits_st, st.lists(filters, max_size=5), selectors)
def test_any_chain_selects_a_valid_token_without_nan(x, fs, sel):
    chain = Chain([*fs, sel])
    c = Candidates.from_logits(x)
    before = x.copy()
    chain.apply(c)
    np.testing.assert_array_equal(x, before)  # input untouched
    assert 1 <= len(c) <= len(x)
    assert 0 <= c.selected < len(c)
    token = c.token
    assert 0 <= token < len(x)
    assert np.isfinite(x[token])  # a masked token is never chosen
    assert not np.isnan(c.logits).any()
    if c.probs is not None:
        assert not np.isnan(c.probs).any()
    assert len(set(c.ids.tolist())) == len(c)


@settings(max_examples=200, deadline=None)
@given(logits_st, st.integers(0, 2**32 - 2))
def test_dist_probs_are_normalised(x, seed):
    c = Candidates.from_logits(x)
    Dist(seed).apply(c)
    assert abs(float(c.probs.astype(np.float64).sum()) - 1.0) < 1e-5
    assert c.probs[c.selected] > 0


@settings(max_examples=100, deadline=None)
@given(logits_st, st.integers(0, 2**32 - 2))
def test_mirostat_v1_is_total(x, seed):
    c = Candidates.from_logits(x)
    Mirostat(len(x), seed, 5.0, 0.1).apply(c)
    assert 0 <= c.selected < len(c)


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.integers(2, 200), elements=finite), st.integers(0, 1000),
       st.lists(st.integers(0, 199), max_size=20))
def test_common_sampler_clone_independence(x, seed, history):
    s = CommonSampler(SamplingParams(seed=seed, repeat_penalty=1.3, frequency_penalty=0.2))
    for t in history:
        s.accept(t % len(x))
    twin = s.clone()
    a = [s.sample(x) for _ in range(3)]
    b = [twin.sample(x) for _ in range(3)]
    assert a == b


@settings(max_examples=100, deadline=None)
@given(logits_st, st.integers(1, 50))
def test_top_k_size_and_order(x, k):
    c = Candidates.from_logits(x)
    TopK(k).apply(c)
    assert len(c) == min(k, len(x)) and c.sorted
    assert (c.logits[:-1] >= c.logits[1:]).all()
