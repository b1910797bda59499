"""The CPU engine's exp (csrc/engine.c: sc_expf, attention's softmax and the SiLU gate): glibc's expf algorithm with
every binary64 operation written separately, so its bits do not depend on the machine's libm; 16 at a time with
AVX-512 (sc_expf16) where compiled in, the same bits as one at a time."""

import ctypes

import numpy as np
import pytest

from samplechain.runtime.cpu_engine import EngineUnavailable, library


@pytest.fixture(scope="module")
def lib():
    try:
        return library()
    except EngineUnavailable as e:
        pytest.skip(f"no compiled engine: {e}")


def run(lib, x: np.ndarray, vector: bool) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    lib.sc_expf_rows(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), x.size, int(vector))
    return y


def inputs() -> np.ndarray:
    rng = np.random.default_rng(11)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 88.72283, 88.72284, -103.97207, -103.97208, 1e-30, -1e-30,
             -1e-45, 88.0, -88.0, -87.33655]
    values = np.concatenate([rng.uniform(-110.0, 90.0, 400_000), -np.abs(rng.standard_normal(200_000)) * 12.0,
                             rng.standard_normal(100_000) * 1e-3, edges]).astype(np.float32)
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)  # any binary32
    return np.concatenate([values, bits])


def test_sixteen_at_a_time_give_the_bits_of_one_at_a_time(lib):
    x = inputs()
    assert np.array_equal(run(lib, x, True).view(np.uint32), run(lib, x, False).view(np.uint32))


def test_exact_values(lib):
    x = np.array([-1.0, -0.5, -10.0, -87.5, -100.0, -103.9, 0.25, 1.0, 88.0, 88.7], np.float32)
    assert [hex(v) for v in run(lib, x, False).view(np.uint32)] == [
        "0x3ebc5ab2", "0x3f1b4598", "0x383e6bce", "0x6cb2bc", "0x1b", "0x1", "0x3fa45af2", "0x402df854",
        "0x7ef882b7", "0x7f7a37fc"]
    special = run(lib, np.array([0.0, -0.0, np.inf, -np.inf, 89.0, -104.0, np.nan], np.float32), True)
    assert special[:6].tolist() == [1.0, 1.0, np.inf, 0.0, np.inf, 0.0] and np.isnan(special[6])


def test_within_one_unit_in_the_last_place_of_binary64_exp(lib):
    """glibc's bound is 0.502 ULP: against binary64's exp rounded to binary32, at most one unit apart, and rarely."""
    x = inputs()
    x = x[np.isfinite(x) & (x > -103.0) & (x < 88.0)]
    got = run(lib, x, True)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    apart = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert apart.max() == 1 and (apart > 0).mean() < 1e-3
