import numpy as np
import pytest
import torch

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


def test_the_engines_halves_round_to_nearest_even_as_numpy():
    """The KV cache's float -> f16 (csrc/engine.c: f32_to_f16) and back, against numpy's conversions: every
    rounding boundary, subnormals, overflow, infinities and NaN."""
    import ctypes

    from samplechain.runtime.cpu_engine import library

    rng = np.random.default_rng(7)
    halves = np.arange(1 << 16, dtype=np.uint32)
    exact = halves.astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(exact)
    up = np.nextafter(exact[finite], np.float32(np.inf))
    # the points between neighbouring halves: ties, and a float32 ulp to either side of them
    mids = ((exact[finite][:-1].astype(np.float64) + exact[finite][1:]) / 2).astype(np.float32)
    mids = mids[np.isfinite(mids)]  # the midpoint next to the largest half is past float16's range
    with np.errstate(invalid="ignore"):
        values = np.concatenate([
            exact, up, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
            rng.standard_normal(100_000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 100_000),
            np.array([65504, 65519.99, 65520, 1e9, -1e9, 2.0 ** -25, 2.0 ** -25 * 1.0001, 2.0 ** -26, 1e-40,
                      np.inf, -np.inf, np.nan, -0.0], dtype=np.float32)])
    values = np.ascontiguousarray(values[~np.isnan(values)], dtype=np.float32)
    lib = library()
    got = np.empty(values.size, dtype=np.uint16)
    lib.sc_f32_to_f16(ctypes.c_void_p(values.ctypes.data), ctypes.c_void_p(got.ctypes.data), values.size)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, values.astype(np.float16).view(np.uint16))
    back = np.empty(halves.size, dtype=np.float32)
    h16 = halves.astype(np.uint16)
    lib.sc_f16_to_f32(ctypes.c_void_p(h16.ctypes.data), ctypes.c_void_p(back.ctypes.data), h16.size)
    np.testing.assert_array_equal(back.view(np.uint32)[finite], exact.view(np.uint32)[finite])
    assert np.isnan(back[~finite & np.isnan(exact)]).all() and np.isinf(back[np.isinf(exact)]).all()
    nan = np.array([np.nan], dtype=np.float32)
    lib.sc_f32_to_f16(ctypes.c_void_p(nan.ctypes.data), ctypes.c_void_p(got.ctypes.data), 1)
    assert got[0] & 0x7C00 == 0x7C00 and got[0] & 0x3FF
    # NaNs, quiet and signalling, both signs: eight at a time (F16C where compiled in) as one at a time
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FA00000, 0x7F802000, 0xFFFFFFFF,
                     0x7FC01234, 0xFF812345, 0x7F9FE000, 0xFFC00001, 0x7FFFE000, 0x7F800400, 0xFF801000, 0x7FD55555],
                    dtype=np.uint32)
    nans = np.ascontiguousarray(bits.view(np.float32))
    eight = np.empty(16, dtype=np.uint16)
    lib.sc_f32_to_f16(ctypes.c_void_p(nans.ctypes.data), ctypes.c_void_p(eight.ctypes.data), 16)
    one = np.empty(16, dtype=np.uint16)
    for i in range(16):
        lib.sc_f32_to_f16(ctypes.c_void_p(nans[i:].ctypes.data), ctypes.c_void_p(one[i:].ctypes.data), 1)
    assert eight.tolist() == one.tolist()
    assert one.tolist() == [0x7E00, 0xFE00, 0x7E00, 0xFE00, 0x7FFF, 0x7F00, 0x7E01, 0xFFFF,
                            0x7E00, 0xFE09, 0x7EFF, 0xFE00, 0x7FFF, 0x7E00, 0xFE00, 0x7EAA]


def test_the_cache_is_16_bit_by_default_and_f32_on_request(smol):
    from samplechain.runtime import Context, load_model

    assert Context(smol.transformer, 32).kv.k.dtype == torch.float16
    m = load_model(None, cache_type_k="f32", cache_type_v="f16")
    kv = Context(m.transformer, 32).kv
    assert kv.k.dtype == torch.float32 and kv.v.dtype == torch.float16
    with pytest.raises(ValueError, match="-ctv: unsupported cache type 'q9'"):
        load_model(None, cache_type_v="q9")
