"""Edge cases of the individual samplers (src/llama-sampler.cpp) and the fixes of llama.cpp bugs."""

import numpy as np
import pytest
from tests.conftest import apply_all

from samplechain import (
    DRY,
    XTC,
    Candidates,
    Dist,
    DynamicTemperature,
    Greedy,
    Infill,
    LogitBias,
    MinP,
    Penalties,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
    Vocab,
)
from samplechain.samplers.probability_filters import softmax_sum_f32

P4 = [0.1, 0.2, 0.3, 0.4]


def realistic(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 2.5, n).astype(np.float32)
    n_head = min(30, n)
    head = rng.choice(n, n_head, replace=False)
    x[head] += rng.uniform(6.0, 16.0, n_head).astype(np.float32)
    return x


def full_top_p(x, p, min_keep=1):
    """Reference: sort everything, llama.cpp's softmax, binary32 running sum."""
    order = np.argsort(-x, kind="stable")
    e = np.exp((x - x.max()).astype(np.float64)).astype(np.float32)
    s = np.cumsum(e, dtype=np.float32)[-1]
    pd = (e / s)[order]
    run = np.cumsum(pd, dtype=np.float32)
    hits = np.flatnonzero(run >= np.float32(p))
    keep = max(int(hits[0]) + 1, min_keep) if len(hits) else len(x)
    return order[:keep], pd[:keep]


@pytest.mark.parametrize("n, seed, p", [(49152, 0, 0.95), (262144, 1, 0.95), (49152, 2, 0.5), (5000, 3, 0.9),
                                        (49152, 4, 0.999)])
def test_top_p_large_path_equals_full_sort(n, seed, p):
    x = realistic(n, seed)
    c = Candidates.from_logits(x)
    TopP(p).apply(c)
    ids, probs = full_top_p(x, p)
    assert c.sorted
    np.testing.assert_array_equal(c.ids, ids)
    np.testing.assert_array_equal(c.probs, probs)


def test_top_p_flat_logits_fall_back_to_full_sort():
    x = np.random.default_rng(5).uniform(-1, 1, 20000).astype(np.float32)
    c = Candidates.from_logits(x)
    TopP(0.95).apply(c)
    ids, _ = full_top_p(x, 0.95)
    np.testing.assert_array_equal(c.ids, ids)


@pytest.mark.parametrize("n, seed", [(10, 0), (20000, 1), (262144, 2)])
def test_softmax_sum_matches_a_sequential_binary32_sum(n, seed):
    x = realistic(n, seed)
    d = x - x.max()
    e = np.exp(d.astype(np.float64)).astype(np.float32)
    assert softmax_sum_f32(d)[0] == np.cumsum(e, dtype=np.float32)[-1]


def test_softmax_sum_with_increasing_logits():
    d = (np.arange(5000, dtype=np.float32) / 100 - 50).astype(np.float32)
    e = np.exp(d.astype(np.float64)).astype(np.float32)
    assert softmax_sum_f32(d)[0] == np.cumsum(e, dtype=np.float32)[-1]


@pytest.mark.parametrize("k", [1, 40, 500, 3000])
def test_top_k_large_path_equals_sort(k):
    x = realistic(49152, 7)
    x[100:200] = x.max()  # ties at the top: lowest index first
    c = Candidates.from_logits(x)
    TopK(k).apply(c)
    np.testing.assert_array_equal(c.ids, np.argsort(-x, kind="stable")[:k])


def test_top_k_ties_at_the_boundary_keep_lowest_ids():
    x = np.zeros(50000, dtype=np.float32)
    x[7] = 1.0
    c = Candidates.from_logits(x)
    TopK(5).apply(c)
    assert c.ids.tolist() == [7, 0, 1, 2, 3]


def test_top_k_sorted_input_only_truncates():
    c = apply_all([TopK(4), TopK(2)], P4)
    assert c.ids.tolist() == [3, 2]


def test_top_p_min_keep():
    c = apply_all([TopP(0.1, 3)], P4)
    assert c.ids.tolist() == [3, 2, 1]


def test_top_p_min_keep_above_size_keeps_all():
    c = apply_all([TopP(0.1, 9)], P4)
    assert len(c) == 4


def test_min_p_min_keep_takes_sorted_fallback():
    c = apply_all([MinP(0.76, 3)], P4)
    assert c.ids.tolist() == [3, 2, 1] and c.sorted


def test_min_p_fast_path_keeps_order():
    c = apply_all([MinP(0.26)], P4)
    assert c.ids.tolist() == [1, 2, 3] and not c.sorted


def test_greedy_first_max_and_empty():
    c = Candidates.from_logits([1.0, 3.0, 3.0, 2.0])
    Greedy().apply(c)
    assert c.token == 1
    e = Candidates(np.empty(0, np.int32), np.empty(0, np.float32))
    Greedy().apply(e)
    assert e.selected == -1


def test_dist_on_empty_selects_nothing():
    e = Candidates(np.empty(0, np.int32), np.empty(0, np.float32))
    Dist(0).apply(e)
    assert e.selected == -1


def test_dist_refuses_all_masked():
    with pytest.raises(ValueError, match="masked"):
        Dist(0).apply(Candidates.from_logits([-np.inf, -np.inf]))


def test_dist_never_selects_a_masked_token():
    s = Dist(1)
    for _ in range(200):
        c = Candidates.from_logits([-np.inf, 0.0, -np.inf, 1.0])
        s.apply(c)
        assert c.token in (1, 3)


def test_temperature_scales_logits():
    c = Candidates.from_logits([1.0, 2.0])
    Temperature(0.5).apply(c)
    assert c.logits.tolist() == [2.0, 4.0] and c.probs is None


def test_temperature_zero_keeps_first_max():
    c = Candidates.from_logits([3.0, 1.0, 3.0])
    Temperature(0.0).apply(c)
    assert c.logits.tolist() == [3.0, -np.inf, -np.inf]


def test_dynamic_temperature_recomputes_normalised_probs():
    c = apply_all([DynamicTemperature(0.8, 0.5, 1.0)], P4)
    assert c.sorted
    assert abs(float(c.probs.astype(np.float64).sum()) - 1.0) < 1e-6
    # entropy of P4 is 1.2799 nats of max ln 4 = 1.3863 -> dyn = 0.3 + 1.0 * 0.92325 = 1.22325
    expected = np.exp(np.log(np.array([0.4, 0.3, 0.2, 0.1])) / 1.2232549)
    np.testing.assert_allclose(c.probs, expected / expected.sum(), atol=1e-5)


def test_dynamic_temperature_single_candidate_unchanged():
    c = Candidates.from_logits([2.0])
    DynamicTemperature(0.5, 0.2, 1.0).apply(c)
    assert c.logits.tolist() == [2.0]


def test_typical_with_masked_tokens_has_no_nan():
    c = Candidates.from_logits([0.0, -np.inf, 1.0, 2.0])
    Typical(0.5).apply(c)
    assert not np.isnan(c.probs).any()
    assert -np.inf not in c.logits.tolist()


def test_top_n_sigma_ignores_masked_tokens():
    c = Candidates.from_logits([*np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32)).tolist(), -np.inf])
    TopNSigma(1.0).apply(c)
    assert np.isinf(c.logits[[0, 1, 4]]).all() and np.isfinite(c.logits[[2, 3]]).all()


def test_xtc_size_below_two_draws_nothing():
    s = XTC(1.0, 0.1, 1, 3)
    s.apply(Candidates.from_logits([1.0]))
    assert s.rng.uniform_float() == np.float32(0.55079788)


def test_xtc_min_keep_blocks_removal():
    c = apply_all([XTC(0.99, 0.09, 2, 0)], [0.4, 0.3, 0.2, 0.1])
    assert len(c) == 4


def test_penalties_clear_sorted_and_touch_only_history():
    s = Penalties(4, 2.0, 0.0, 0.0)
    s.accept(1)
    c = Candidates.from_logits([1.0, 1.0, -1.0])
    c.sorted = True
    s.apply(c)
    assert c.logits.tolist() == [1.0, 0.5, -1.0] and not c.sorted


def test_penalties_window_slides():
    s = Penalties(2, 1.0, 1.0, 0.0)
    for t in (0, 0, 1):
        s.accept(t)
    c = Candidates.from_logits([0.0, 0.0, 0.0])
    s.apply(c)
    assert c.logits.tolist() == [-1.0, -1.0, 0.0]


def test_penalties_on_reordered_candidates():
    s = Penalties(4, 1.0, 0.0, 1.5)
    s.accept(3)
    c = Candidates.from_logits([0.0, 1.0, 2.0, 3.0])
    TopK(3).apply(c)
    s.apply(c)
    assert c.ids.tolist() == [3, 2, 1] and c.logits.tolist() == [1.5, 2.0, 1.0]


def test_logit_bias_identity_and_reordered():
    s = LogitBias(4, {0: 5.0, 2: -np.inf})
    c = Candidates.from_logits([0.0, 1.0, 2.0, 3.0])
    s.apply(c)
    assert c.logits.tolist() == [5.0, 1.0, -np.inf, 3.0]
    c = Candidates.from_logits([0.0, 1.0, 2.0, 3.0])
    TopK(4).apply(c)
    s.apply(c)
    assert dict(zip(c.ids.tolist(), c.logits.tolist(), strict=True)) == {0: 5.0, 1: 1.0, 2: -np.inf, 3: 3.0}
    assert not c.sorted  # llama.cpp leaves the stale flag


def test_logit_bias_duplicates_are_summed():
    s = LogitBias(4, [(1, 1.0), (1, 2.0)])
    c = Candidates.from_logits([0.0, 0.0, 0.0, 0.0])
    s.apply(c)
    assert c.logits.tolist() == [0.0, 3.0, 0.0, 0.0]


def test_input_logits_are_never_modified():
    x = np.log(np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32))
    before = x.copy()
    pen = Penalties(4, 2.0, 1.0, 1.0)
    pen.accept(2)
    for s in (LogitBias(4, {1: 2.0}), pen, Temperature(0.5), TopNSigma(0.5), Typical(0.5), TopP(0.5), MinP(0.3)):
        c = Candidates.from_logits(x)
        s.apply(c)
    np.testing.assert_array_equal(x, before)
    assert x.flags.writeable


def make_vocab():
    tokens = [b"<s>", b"</s>", b"a", b"b", b"c", b"\n", b"ab", b"abc", b"x:", b":", b'"', b"*", b" ", b"hello",
              b"hel", b"<eot>"]
    return Vocab(tokens, eog=[1, 15], special=[0, 1, 15], bos=0, eos=1, eot=15)


def test_dry_with_vocab_breakers():
    v = make_vocab()
    s = DRY(v, 1.0, 1.75, 2, 64)
    assert s.breakers[5] == ((),) and s.breakers[8] == ((),) and s.breakers[9] == ((),)
    for t in (2, 3, 4, 2, 3):
        s.accept(t)
    c = Candidates.from_logits(np.zeros(v.n_tokens, dtype=np.float32))
    s.apply(c)
    assert c.logits[4] == np.float32(-1.0) and np.count_nonzero(c.logits) == 1


def test_dry_breaker_prefix_tails():
    v = Vocab([b"a", b"\n\n", b"\n", b"x\n", b"q"])
    s = DRY(v, 1.0, 1.75, 2, 64, seq_breakers=["\n\n"])
    assert s.breakers == {1: ((),), 2: ((2,),), 3: ((2,),)}


def test_dry_breaker_resets_repeat_window():
    s = DRY.from_token_breakers(1.0, 2.0, 2, 64, [[9]])
    for t in (1, 2, 3, 9, 2):
        s.accept(t)
    assert s.penalties() is None  # one token since the breaker: below allowed_length
    s.accept(1)
    s.accept(2)  # "1 2" repeats in the 3 tokens after the breaker; a 3 would extend it
    assert s.penalties() == {3: 2}


def test_dry_worked_example_from_the_source():
    # window a b c c b c y a b c: c would extend "a b c" (3 -> penalty base^1), y extends "b c" (2 -> base^0)
    a, b, c, y = 0, 1, 2, 3
    s = DRY.from_token_breakers(1.0, 2.0, 2, 64)
    for t in (a, b, c, c, b, c, y, a, b, c):
        s.accept(t)
    assert s.penalties() == {c: 3, y: 2}


def test_dry_exponent_clamp():
    s = DRY.from_token_breakers(1.0, 1e30, 1, 64)
    for t in (1, 2, 1, 2, 1, 2, 1):
        s.accept(t)
    cands = Candidates.from_logits(np.zeros(3, np.float32))
    s.apply(cands)
    assert np.isfinite(cands.logits).all()


def test_infill_prefers_eog_when_likely():
    v = make_vocab()
    x = np.full(v.n_tokens, -10.0, dtype=np.float32)
    x[1] = 2.0
    x[2] = 1.0
    c = Candidates.from_logits(x)
    Infill(v).apply(c)
    assert c.ids.tolist() == [1, 15]  # only end-of-generation tokens, renormalised
    np.testing.assert_allclose(c.probs, [1.0, np.exp(-12.0)], rtol=1e-5)


def test_infill_merges_prefixes():
    v = make_vocab()
    x = np.full(v.n_tokens, -20.0, dtype=np.float32)
    x[13], x[14], x[4] = 3.0, 2.5, 2.9  # "hello", "hel" (prefix of hello), "c"
    c = Candidates.from_logits(x)
    TopK(5).apply(c)
    Infill(v).apply(c)
    # "hel" merged into "hello"; the EOG token 1 (in the top 5 by id order among ties) is always kept
    assert c.ids.tolist() == [13, 4, 1]
    e = np.exp(np.array([3.0, 2.5, 2.9, -20.0, -20.0]) - 3.0)
    p = e / e.sum()
    kept = np.array([p[0] + p[1], p[2], p[4]])
    np.testing.assert_allclose(c.probs, kept / kept.sum(), rtol=1e-5)


def test_infill_collapses_to_eot_without_text():
    v = make_vocab()
    x = np.full(v.n_tokens, -30.0, dtype=np.float32)
    x[[3, 4, 5, 9, 10, 11, 12]] = 0.0  # seven texts, none a prefix of another, each p = 1/7 < 0.2
    c = Candidates.from_logits(x)
    Infill(v).apply(c)
    assert c.ids.tolist() == [15] and c.logits.tolist() == [1.0]
