"""Candidates: construction, validation of bad input, lazily derived and never stale probabilities."""

import numpy as np
import pytest

from samplechain import Candidates, Chain, Dist, TopK
from samplechain.samplers._ops import softmax


def test_full_vocab_ids_are_implicit_and_float32_is_not_copied():
    x = np.arange(5, dtype=np.float32)
    c = Candidates.from_logits(x)
    assert c.identity and c.ids.tolist() == [0, 1, 2, 3, 4]
    assert np.shares_memory(c.logits, x)
    assert c.probs is None and c.selected == -1 and not c.sorted and len(c) == 5


def test_other_inputs_are_converted():
    c = Candidates.from_logits([1, 2, 3])
    assert c.logits.dtype == np.float32


@pytest.mark.parametrize("bad, match", [
    ([], "empty"), (np.zeros((2, 2)), "1-D"), ([0.0, np.nan], "NaN"), ([0.0, np.inf], r"\+inf"),
    ("abc", "convert"),
])
def test_bad_logits(bad, match):
    with pytest.raises(ValueError, match=match):
        Candidates.from_logits(bad)


def test_chain_sample_rejects_bad_logits():
    with pytest.raises(ValueError, match="NaN"):
        Chain([Dist(0)]).sample(np.array([1.0, np.nan], dtype=np.float32))


def test_probs_dropped_when_logits_change():
    c = Candidates.from_logits([1.0, 2.0, 3.0])
    softmax(c, do_sort=False)
    assert c.probs is not None
    c.set_logits(c.logits * 2)
    assert c.probs is None


def test_probs_follow_a_subset():
    c = Candidates.from_logits([1.0, 2.0, 3.0])
    p = softmax(c, do_sort=False).copy()
    TopK(2).apply(c)
    assert c.ids.tolist() == [2, 1] and c.probs.tolist() == [p[2], p[1]]


def test_from_arrays_validates():
    c = Candidates.from_arrays([5, 9], [1.0, 0.5])
    assert c.ids.tolist() == [5, 9] and not c.identity
    with pytest.raises(ValueError, match="equal length"):
        Candidates.from_arrays([1], [1.0, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        Candidates.from_arrays([1], [np.nan])


def test_float32_of_another_byte_order_is_converted():
    x = np.array([1.0, 3.0, 2.0], dtype=">f4")
    c = Candidates.from_logits(x)
    assert c.logits.dtype == np.float32 and c.logits.dtype.isnative and c.logits.tolist() == [1.0, 3.0, 2.0]
    assert not np.shares_memory(c.logits, x)


def test_logits_are_read_only_to_samplers_but_the_callers_array_stays_writable():
    x = np.zeros(5000, dtype=np.float32)
    c = Candidates.from_logits(x)
    assert np.shares_memory(c.logits, x) and not c.logits.flags.writeable and x.flags.writeable
