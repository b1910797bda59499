"""The CPU engine on every GGUF type it keeps in its own form (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16,
BF16): random matrices built as GGUF blocks, decoded exactly (against the gguf package's dequantization), and run
through the engine's linear on every kernel variant this CPU has, at several batch sizes. The engine's result is
checked bit for bit against a NumPy evaluation of its definition (int16 activations, exact integer block sums, the
float operations in the engine's fixed order); results are the same bits at every batch size and on every variant."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from samplechain.runtime.cpu_engine import linear_forward, pack_linear, packed_bytes, supported_isas
from samplechain.runtime.weights import Linear, Part, decode_blocks

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"]
BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
         "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "F16": (1, 2), "BF16": (1, 2)}
BATCHES = [1, 2, 5, 8, 16, 33, 64, 80]  # 64: a whole token group of the AVX2 kernels; 80 crosses it
ROWS, N_IN = 48, 512


def _f16(rng, n, lo, hi):
    """n f16 scales with random signs-free magnitudes in [lo, hi), as bytes [n, 2]."""
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def make_raw(kind: str, rows: int, n_in: int, seed: int = 0) -> np.ndarray:
    """A random [rows, n_in] matrix of GGUF type ``kind`` as its raw bytes [rows, row bytes]."""
    rng = np.random.default_rng(seed)
    if kind == "F16":
        return rng.standard_normal((rows, n_in)).astype(np.float16).view(np.uint8)
    if kind == "BF16":
        return (rng.standard_normal((rows, n_in)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(
            np.uint8)
    per, size = BLOCK[kind]
    n = rows * n_in // per
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)  # values, high bits and 6-bit scales: any bytes are valid
    if kind in ("Q4_K", "Q5_K"):
        b[:, 0:2], b[:, 2:4] = _f16(rng, n, 1e-3, 4e-3), _f16(rng, n, 1e-3, 4e-3)
    elif kind == "Q6_K":
        b[:, 208:210] = _f16(rng, n, 1e-4, 4e-4)
    else:
        b[:, 0:2] = _f16(rng, n, 5e-3, 2e-2)
        if kind in ("Q4_1", "Q5_1"):
            b[:, 2:4] = _f16(rng, n, -0.1, 0.1)
    return b.reshape(rows, -1)


def _linear(kind: str, rows: int = ROWS, n_in: int = N_IN, seed: int = 0) -> Linear:
    return Linear(parts=[Part(kind, make_raw(kind, rows, n_in, seed), n_in)])


def _reference_weights(kind: str, raw: np.ndarray, n_in: int) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[kind]).reshape(raw.shape[0], n_in).astype(np.float32)


def fma32(a, b, c):
    """float32 fma(a, b, c), correctly rounded (the product is exact in float64; the sum is split exactly into
    s + e, and a float32 tie of s is broken by e's sign)."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
    tie = (s == (r64 + other.astype(np.float64)) / 2) & (e != 0)
    toward_other = np.sign(e) == np.sign(other.astype(np.float64) - r64)
    return np.where(tie & toward_other, other, r).astype(np.float32)


def quantize(x: np.ndarray, qmax: int = 32767):
    """The engine's activations: per 32-block q = round(x / d), d = amax / qmax (roundf: half away from 0); qmax
    32767 (int16) or 127 (the 8-bit family)."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1)
    d = amax / np.float32(qmax)
    inv = np.where(d != 0, np.float32(qmax) / np.where(amax == 0, np.float32(1), amax), np.float32(0))
    y = (b * inv[..., None].astype(np.float32)).astype(np.float64)
    q = np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -qmax, qmax).astype(np.int64)
    return q, d.astype(np.float32), q.sum(-1)


def engine_definition(lin: Linear, x: np.ndarray, qmax: int = 32767) -> np.ndarray:
    """y = x @ W.T as the engine defines it, in its float order, from the decoded blocks (activations quantized to
    ``qmax``)."""
    (part,) = lin.parts
    n = x.shape[0]
    if part.type_name in ("F16", "BF16"):
        w = part.dequantize()
        acc = np.zeros((n, part.rows), np.float32)
        for k in range(part.n_in):
            acc = fma32(w[None, :, k], x[:, k, None], acc)
        return acc
    blk = part.blocks()
    wq = blk.u.astype(np.int64) - blk.zero
    scale, minimum = blk.scale(), blk.minimum()
    xq, xd, xs = quantize(x, qmax)
    per = blk.group
    acc = np.zeros((n, part.rows), np.float32)
    for b in range(part.n_in // 32):
        for h in range(32 // per):
            lo = 32 * b + per * h
            isum = xq[:, b, per * h:per * (h + 1)] @ wq[:, lo:lo + per].T  # exact (int64)
            acc = fma32(isum.astype(np.float32), scale[None, :, lo // per] * xd[:, b, None], acc)
        if minimum is not None:
            acc = fma32(minimum[None, :, b], (xd[:, b] * xs[:, b].astype(np.float32))[:, None], acc)
    return acc


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_decode_exactly(kind):
    """Stored values and scales give gguf's dequantization bit for bit (so the engine's integer form is exact)."""
    raw = make_raw(kind, ROWS, N_IN)
    part = Part(kind, raw, N_IN)
    want = _reference_weights(kind, raw, N_IN)
    np.testing.assert_array_equal(part.dequantize(), want)
    if kind not in ("F16", "BF16"):
        np.testing.assert_array_equal(decode_blocks(kind, raw).dequantize(), want)


@pytest.mark.parametrize("kind", TYPES)
def test_engine_is_exact_and_invariant(kind):
    lin = _linear(kind)
    x = np.random.default_rng(1).standard_normal((max(BATCHES), N_IN)).astype(np.float32)
    want = engine_definition(lin, x)
    results = {}
    for isa in supported_isas():
        full = linear_forward(lin, x, isa)
        np.testing.assert_array_equal(full, want, err_msg=f"{kind} on {isa}")
        for n in BATCHES[:-1]:
            np.testing.assert_array_equal(linear_forward(lin, x[:n], isa), full[:n], err_msg=f"{kind} {isa} n={n}")
        results[isa] = full
    # and close to the float64 product with gguf's weights (the engine's only error: 16-bit activations)
    w = _reference_weights(kind, lin.parts[0].raw, N_IN).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    assert np.abs(want - exact).max() <= 2e-4 * np.abs(exact).max()


@pytest.mark.parametrize("kind", [k for k in TYPES if k not in ("F16", "BF16")])
def test_8bit_activation_engine_is_exact_and_invariant(kind):
    """The 8-bit family (generic and AVX2) is its definition bit for bit at every batch size; its error against the
    float64 product is llama.cpp's (8-bit activations), ~100x the 16-bit one's."""
    lin = _linear(kind)
    x = np.random.default_rng(1).standard_normal((max(BATCHES), N_IN)).astype(np.float32)
    want = engine_definition(lin, x, qmax=127)
    isas = supported_isas(q8=True)
    assert "generic-q8" in isas
    for isa in isas:
        full = linear_forward(lin, x, isa)
        np.testing.assert_array_equal(full, want, err_msg=f"{kind} on {isa}")
        for n in BATCHES[:-1]:
            np.testing.assert_array_equal(linear_forward(lin, x[:n], isa), full[:n], err_msg=f"{kind} {isa} n={n}")
    w = _reference_weights(kind, lin.parts[0].raw, N_IN).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    assert 2e-4 * np.abs(exact).max() < np.abs(want - exact).max() <= 2e-2 * np.abs(exact).max()


def test_chained_parts_equal_each_part_alone():
    """q|k|v-style fusion of different types: one chain of row ranges, each in its own form."""
    kinds = ["Q5_0", "Q8_0", "Q6_K", "F16", "Q4_K"]
    lins = [_linear(k, rows=16 * (i + 1), seed=i) for i, k in enumerate(kinds)]
    fused = Linear.concat(lins)
    assert fused.form == "+".join(sorted(kinds))
    x = np.random.default_rng(2).standard_normal((5, N_IN)).astype(np.float32)
    for isa in supported_isas() + supported_isas(q8=True):
        want = np.concatenate([linear_forward(lin, x, isa) for lin in lins], axis=1)
        np.testing.assert_array_equal(linear_forward(fused, x, isa), want)
    np.testing.assert_array_equal(fused.dense_weight().numpy(),
                                  np.concatenate([lin.dense_weight().numpy() for lin in lins]))


@pytest.mark.parametrize("kind", TYPES)
def test_packed_size_is_close_to_the_gguf_size(kind):
    lin = _linear(kind, rows=64)
    keep: list = []
    pack_linear(lin, keep)
    assert packed_bytes(keep) <= 1.06 * lin.parts[0].raw.nbytes
