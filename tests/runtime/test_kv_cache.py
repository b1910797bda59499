import numpy as np
import pytest

from samplechain.runtime import KVCache, KVCacheFull


def cache(size=16, n_seq=4):
    return KVCache(n_layer=1, n_head_kv=1, head_dim_k=2, head_dim_v=2, size=size, n_seq_max=n_seq)


def fill(kv, seq, positions):
    cells = kv.find_slot(len(positions))
    kv.occupy(cells, np.asarray(positions, dtype=np.int64), [(seq,)] * len(positions))
    return cells


def owned(kv, seq):
    return sorted(kv.pos[kv.seq[:, seq]].tolist())


def test_slots_fill_from_head_and_report_full():
    kv = cache(size=8)
    assert fill(kv, 0, range(5)).tolist() == [0, 1, 2, 3, 4]
    assert kv.head == 5 and kv.n_used == 5 and kv.n_attn == 5
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0), kv.seq_pos_max(1)) == (0, 4, -1)
    with pytest.raises(KVCacheFull, match="3 of 8 are free"):
        kv.find_slot(4)
    with pytest.raises(KVCacheFull, match="does not fit"):
        kv.find_slot(9)


def test_seq_rm_half_open_ranges_and_negative_bounds():
    kv = cache()
    fill(kv, 0, range(10))
    assert kv.seq_rm(0, 3, 6)
    assert owned(kv, 0) == [0, 1, 2, 6, 7, 8, 9]
    assert kv.head == 3  # moved back to the first freed cell
    kv.seq_rm(0, 8, -1)  # p1 < 0: to infinity
    assert owned(kv, 0) == [0, 1, 2, 6, 7]
    kv.seq_rm(0, -5, 2)  # p0 < 0: from 0
    assert owned(kv, 0) == [2, 6, 7]
    # gaps are fine: the next slot reuses freed cells from head on
    assert fill(kv, 1, [0, 1]).tolist() == [0, 1]


def test_shared_cells_survive_until_the_last_owner_leaves():
    kv = cache()
    fill(kv, 0, range(4))
    kv.seq_cp(0, 1, 1, 3)
    assert owned(kv, 1) == [1, 2]
    kv.seq_rm(0, -1, -1)
    assert kv.n_used == 2 and owned(kv, 1) == [1, 2]
    kv.seq_rm(-1, 2, 3)  # seq -1: every owner
    assert owned(kv, 1) == [1]
    kv.seq_cp(1, 1)  # src == dst: no-op
    assert owned(kv, 1) == [1]


def test_seq_keep_empties_every_other_cell():
    kv = cache()
    fill(kv, 0, range(3))
    fill(kv, 1, range(3))
    kv.seq_cp(0, 2)
    kv.seq_keep(2)
    assert owned(kv, 2) == [0, 1, 2] and owned(kv, 0) == [] and owned(kv, 1) == []
    assert kv.n_used == 3


def test_seq_add_shifts_positions_records_the_shift_and_drops_negative_ones():
    kv = cache()
    fill(kv, 0, range(8))
    kv.seq_add(0, 4, -1, -2)
    assert kv.pos[:8].tolist() == [0, 1, 2, 3, 2, 3, 4, 5]
    assert kv.shift[4:8].tolist() == [-2, -2, -2, -2] and kv.has_shift
    kv.seq_add(0, 0, 2, -1)  # position 0 -> -1: emptied
    assert kv.pos[0] == -1 and kv.head == 0
    assert kv.shift[1] == -1
    kv.seq_add(0, 0, -1, 0)  # delta 0: no-op
    shift = kv.take_shift()
    assert shift is not None and shift[4] == -2 and not kv.has_shift and kv.take_shift() is None


def test_seq_add_moves_sequences_sharing_the_cells():
    kv = cache()
    fill(kv, 0, range(4))
    kv.seq_cp(0, 1)
    kv.seq_add(0, 2, -1, 10)
    assert owned(kv, 1) == [0, 1, 12, 13]  # positions live in the cells


def test_seq_div_records_new_minus_old():
    kv = cache()
    fill(kv, 0, range(8))
    kv.seq_div(0, 4, 8, 2)
    assert kv.pos[:8].tolist() == [0, 1, 2, 3, 2, 2, 3, 3]
    # llama.cpp records old - new (+2, +3, ...) and so rotates keys the wrong way
    assert kv.shift[:8].tolist() == [0, 0, 0, 0, -2, -3, -3, -4]
    kv.seq_div(0, 0, -1, 1)
    assert kv.pos[:8].tolist() == [0, 1, 2, 3, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="positive"):
        kv.seq_div(0, 0, -1, 0)


def test_mask_follows_sequence_position_and_window():
    kv = cache()
    fill(kv, 0, range(4))
    fill(kv, 1, range(3))
    m = kv.mask(np.array([3, 2]), np.array([0, 1]), kv.n_attn)
    assert m.astype(int).tolist() == [[1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]]
    m = kv.mask(np.array([3]), np.array([0]), kv.n_attn, window=2)
    assert m.astype(int).tolist() == [[0, 0, 1, 1, 0, 0, 0]]


@pytest.mark.parametrize("bad", [-2, 4, 1.5, True, None])
def test_bad_sequence_ids(bad):
    kv = cache()
    with pytest.raises(ValueError, match="sequence id"):
        kv.seq_rm(bad, 0, 1) if bad != -2 else kv.seq_rm(bad)
    with pytest.raises(ValueError, match="sequence id"):
        kv.seq_add(bad, 0, 1, 1)


def test_bad_sizes():
    with pytest.raises(ValueError, match="size"):
        cache(size=0)
    with pytest.raises(ValueError, match="n_seq_max"):
        cache(n_seq=300)
