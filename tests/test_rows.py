"""samplechain.rows: the torch row layout (prefix and mask forms) and its exact helpers."""

import numpy as np
import pytest
import torch

from samplechain.rows import Rows, block_max, seq_cumsum_f32, seq_sum_f32, stable_order, top_candidates


def rows_of(x) -> Rows:
    x = torch.as_tensor(np.asarray(x, dtype=np.float32))
    return Rows(x, {}, {}, block_max(x)[0])


def candidates(r: Rows) -> list[list[tuple[int, float]]]:
    """Each row's candidate array as (id, logit) pairs, in order."""
    mask = r.mask()
    out = []
    for j in range(r.batch):
        ids = range(r.width) if r.ids is None else r.ids[j].tolist()
        keep = [True] * r.width if mask is None else mask[j].tolist()
        out.append([(i, v) for i, v, k in zip(ids, r.logits[j].tolist(), keep, strict=True) if k])
    return out


def test_sort_is_llama_order_and_gives_the_prefix_form():
    r = rows_of([[1.0, 3.0, 3.0, 2.0], [0.0, -1.0, 5.0, 5.0]])
    r.remove(torch.tensor([[False, False, False, True], [True, False, False, False]]))
    r.sort()
    assert r.sorted and r.live is None and r.n.tolist() == [[3], [3]]
    assert candidates(r) == [[(1, 3.0), (2, 3.0), (0, 1.0)], [(2, 5.0), (3, 5.0), (1, -1.0)]]


def test_keep_first_in_both_forms():
    r = rows_of([[4.0, 3.0, 2.0, 1.0]])
    r.sort()
    r.keep_first(torch.tensor([[2]]))  # prefix form: only the count changes
    assert r.n.tolist() == [[2]] and candidates(r) == [[(0, 4.0), (1, 3.0)]]
    m = rows_of([[1.0, 9.0, 2.0, 8.0]])
    m.remove(torch.tensor([[False, True, False, False]]))
    m.keep_first(torch.tensor([[2]]))  # mask form: the first two candidates, in place
    assert candidates(m) == [[(0, 1.0), (2, 2.0)]]


def test_to_mask_sets_the_entries_past_the_count_to_minus_inf():
    r = rows_of([[4.0, 3.0, 2.0]])
    r.sort()
    r.keep_first(torch.tensor([[1]]))
    r.to_mask()
    assert not r.sorted and r.n is None
    assert r.logits.tolist() == [[4.0, float("-inf"), float("-inf")]]
    assert r.live.tolist() == [[True, False, False]]


@pytest.mark.parametrize("v", [5000, 49152, 49152 + 37])
def test_top_candidates_are_the_largest_values(v):
    rng = np.random.default_rng(v)
    x = rng.normal(0, 3, (4, v)).astype(np.float32)
    r = rows_of(x)
    values, pos = top_candidates(r, 41)
    want = -np.sort(-x, axis=1)[:, :41]
    np.testing.assert_array_equal(values.numpy(), want)
    np.testing.assert_array_equal(np.take_along_axis(x, pos.numpy(), 1), want)


def test_top_candidates_with_the_maxima_in_one_block():
    x = np.zeros((1, 8192), dtype=np.float32)
    x[0, 64:128] = np.arange(64, dtype=np.float32) + 1  # one block holds the 41 largest
    values, pos = top_candidates(rows_of(x), 41)
    assert pos[0].tolist() == list(range(127, 86, -1)) and values[0, 0].item() == 64.0


def test_stable_order_puts_equal_values_by_position():
    v, pos = stable_order(torch.tensor([[3.0, 2.0, 2.0, 2.0]]), torch.tensor([[5, 9, 1, 4]]))
    assert v.tolist() == [[3.0, 2.0, 2.0, 2.0]] and pos.tolist() == [[5, 1, 4, 9]]


def test_sequential_sums_are_binary32_left_to_right():
    t = np.array([[1.0, 1e-8, 1e-8, 1e-8, -1.0]], dtype=np.float32)
    assert seq_sum_f32(torch.from_numpy(t)).item() == np.add.accumulate(t[0], dtype=np.float32)[-1] == 0.0
    np.testing.assert_array_equal(seq_cumsum_f32(torch.from_numpy(t)).numpy()[0],
                                  np.add.accumulate(t[0], dtype=np.float32))


def test_block_max_and_row_max_see_nan_and_the_tail():
    x = torch.zeros(2, 4096 + 3)
    x[0, 4097] = 7.0
    x[1, 10] = float("nan")
    bm, row_max = block_max(x)
    assert bm.shape == (2, 64) and row_max[0].item() == 7.0 and np.isnan(row_max[1].item())


def test_flags_combine_into_one_column():
    r = rows_of([[0.0], [0.0], [0.0]])
    assert r.unsure().tolist() == [[False], [False], [False]]
    r.flag(torch.tensor([True, False, False]))
    r.flag(torch.tensor([[0, 0], [0, 0], [0, 3]]))
    assert r.unsure().tolist() == [[True], [False], [True]]
