"""Bit-exact vectors of std::mt19937 + libstdc++ distributions, as llama.cpp built with GCC draws them."""

import numpy as np
import pytest

from samplechain.rng import DEFAULT_SEED, LlamaRng, check_seed

VECTORS = {
    0: ([2357136044, 2546248239, 3071714933, 3626093760],
        [0.59284461651668263, 0.84426574425659828, 0.85794561998982988, 0.84725173738433124],
        [0.548813522, 0.592844605, 0.715189338, 0.844265759], [2, 3, 3, 3, 3, 2, 1, 0]),
    42: ([1608637542, 3421126067, 4083286876, 787846414],
         [0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655],
         [0.37454012, 0.796543002, 0.95071429, 0.183434784], [3, 1, 3, 2, 2, 0, 2, 2]),
    4242: ([1395647406, 3472777710, 4039049869, 1035264657],
           [0.80856906956176955, 0.24104133666036989, 0.45280400731461307, 0.33380064770730894],
           [0.324949473, 0.808569074, 0.940414608, 0.241041332], [3, 1, 2, 2, 1, 3, 2, 3]),
    1: ([1791095845, 4282876139, 3093770124, 4005303368],
        [0.99718480823026556, 0.93255736136816547, 0.128124447772306, 0.99904051546527362],
        [0.41702199, 0.997184813, 0.720324516, 0.932557344], [3, 3, 1, 3, 1, 2, 2, 3]),
    1234: ([822569775, 2137449171, 2671936806, 3512589365],
           [0.49766366630595166, 0.81783844288953322, 0.61211189358442275, 0.77135991905474999],
           [0.191519454, 0.497663677, 0.622108757, 0.81783843], [2, 3, 3, 3, 3, 1, 1, 3]),
}


@pytest.mark.parametrize("seed", sorted(VECTORS))
def test_raw_words(seed):
    r = LlamaRng(seed)
    assert [r.next_u32() for _ in range(4)] == VECTORS[seed][0]


@pytest.mark.parametrize("seed", sorted(VECTORS))
def test_uniform_double_is_bit_exact(seed):
    r = LlamaRng(seed)
    assert [r.uniform_double() for _ in range(4)] == VECTORS[seed][1]


@pytest.mark.parametrize("seed", sorted(VECTORS))
def test_uniform_float_is_bit_exact(seed):
    r = LlamaRng(seed)
    assert [r.uniform_float() for _ in range(4)] == [np.float32(v) for v in VECTORS[seed][2]]


@pytest.mark.parametrize("seed", sorted(VECTORS))
def test_discrete_draws(seed):
    r = LlamaRng(seed)
    p = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    assert [r.discrete(p) for _ in range(8)] == VECTORS[seed][3]


def test_discrete_singleton_consumes_nothing():
    r = LlamaRng(0)
    assert r.discrete(np.array([1.0], dtype=np.float32)) == 0
    assert r.next_u32() == 2357136044


def test_mt19937_10000th_word():
    r = LlamaRng(5489)
    for _ in range(9999):
        r.next_u32()
    assert r.next_u32() == 4123659995


def test_uniform_clamps_below_one():
    class Max(LlamaRng):
        pass
    r = LlamaRng(0)
    r._mt.getrandbits = lambda k: (1 << k) - 1  # every word all ones
    assert r.uniform_double() == 1.0 - 2.0**-53
    assert r.uniform_float() == np.float32(1.0 - 2.0**-24)


def test_xtc_chance_draws_seed_3():
    r = LlamaRng(3)
    got = [r.uniform_float() for _ in range(5)]
    assert got == [np.float32(v) for v in (0.55079788, 0.0707248822, 0.708147824, 0.839949071, 0.290904731)]


def test_clone_continues_the_same_stream():
    r = LlamaRng(42)
    r.next_u32()
    c = r.clone()
    assert [r.next_u32() for _ in range(3)] == [c.next_u32() for _ in range(3)]


@pytest.mark.parametrize("bad", [-2, 2**32, 1.5, "1", True, None])
def test_bad_seed(bad):
    with pytest.raises(ValueError, match="seed"):
        check_seed(bad)


def test_minus_one_is_default_seed():
    assert check_seed(-1) == DEFAULT_SEED


def test_mark_and_rewind_repeat_the_draws():
    r = LlamaRng(11)
    for _ in range(620):  # near a block boundary, so the rewind crosses it
        r.next_u32()
    m = r.mark()
    first = [r.uniform_double() for _ in range(4)]
    r.rewind(m)
    assert [r.uniform_double() for _ in range(4)] == first
    fresh = LlamaRng(11)
    for _ in range(620):
        fresh.next_u32()
    assert [fresh.uniform_double() for _ in range(4)] == first
    with pytest.raises(ValueError, match="rewind"):
        r.rewind(0)
