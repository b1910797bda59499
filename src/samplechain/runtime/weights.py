"""Weights from GGUF as torch modules' raw material: 4-bit linears on torch's int4 kernel, dense ones otherwise.

A ``Linear`` keeps the GGUF rows of its matrices as stored (``parts``: views of the memory-mapped file) for every type
the CPU engine runs in its own form (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, F16, BF16; ``decode_blocks``
gives a quantized type's stored values and exact scales), and packs nothing itself: the engine (``cpu_engine.py``)
packs the parts for its kernels, the torch paths derive what they need on use. Q4_0 / Q4_1 / Q4_K as the 4-bit form
``q4 = (q, d, m)`` with ``w = d·q + m`` map exactly onto ``torch._weight_int4pack_mm_for_cpu`` (group size 32): a
block's nibbles are its 4-bit values (low nibbles elements 0-15, high nibbles 16-31), and the kernel's per-group
``(scale, zero)`` with ``w = (q - 8)·scale + zero`` is ``(d, m + 8·d)`` (Q4_0: m = -8·d), packed on first use; Q8_0 /
Q5_0 have the 8-bit form ``q8 = (q, d)``; other types run as their dequantized matrix. The int4 kernel is a private
torch function: torch is pinned, and ``Linear.dense()`` keeps the dequantized path, which the tests compare against.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from samplechain.gguf import GGUFFile

INT4_TYPES = {"Q4_0", "Q4_1", "Q4_K"}
INT8_TYPES = {"Q8_0", "Q5_0"}
GROUP = 32


def q4_unpack(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q uint8 [out, in], d float32 [out, groups], m float32 [out, groups]) of a Q4_0/Q4_1 matrix."""
    block = 20 if kind == "Q4_1" else 18
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, block)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if kind == "Q4_1":
        m = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
        qs = blocks[:, :, 4:]
    else:
        m = -8.0 * d
        qs = blocks[:, :, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, -1)
    return q, d, m


def q4k_unpack(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K as the 4-bit form: each 32-element sub-block is ``w = (d·sc)·q - dmin·m`` with 6-bit ``sc``/``m``, so
    its scale ``d·sc`` and minimum ``-dmin·m`` are exact in float32 (llama.cpp's ``dequantize_row_q4_K``)."""
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, 144)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    dmin = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
    sc_raw = blocks[:, :, 4:16].astype(np.uint8)
    qs = blocks[:, :, 16:].reshape(out, -1, 4, 32)  # 4 pairs of sub-blocks: low nibbles, then high nibbles
    sc = np.empty((*sc_raw.shape[:2], 8), dtype=np.float32)
    mn = np.empty_like(sc)
    for j in range(8):  # get_scale_min_k4
        if j < 4:
            sc[..., j], mn[..., j] = sc_raw[..., j] & 63, sc_raw[..., j + 4] & 63
        else:
            sc[..., j] = (sc_raw[..., j + 4] & 0xF) | ((sc_raw[..., j - 4] >> 6) << 4)
            mn[..., j] = (sc_raw[..., j + 4] >> 4) | ((sc_raw[..., j] >> 6) << 4)
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(out, -1)  # sub-block 2i: low nibbles of pair i, 2i+1: high
    scale = (d[..., None] * sc).reshape(out, -1)
    minimum = -(dmin[..., None] * mn).reshape(out, -1)
    return q, scale, minimum


def q8_unpack(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [out, in], d float32 [out, groups]) of a Q8_0 or Q5_0 matrix: w = d·q exactly."""
    block = 34 if kind == "Q8_0" else 22
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, block)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if kind == "Q8_0":
        return blocks[:, :, 2:].copy().view(np.int8).reshape(out, -1), d
    qh = blocks[:, :, 2:6].copy().view("<u4")[:, :, 0]
    qs = blocks[:, :, 6:]
    high = ((qh[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return ((low | high).astype(np.int16) - 16).astype(np.int8).reshape(out, -1), d


def _f16_bits(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian f16 at byte ``at`` of each block, as uint16 bits."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.uint16)[..., 0]


def _f16(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16).astype(np.float32)


def _k_scales(raw12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 8 sub-blocks' 6-bit scales and minima (llama.cpp's get_scale_min_k4), uint8 [..., 8]."""
    sc = np.empty((*raw12.shape[:-1], 8), dtype=np.uint8)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j], mn[..., j] = raw12[..., j] & 63, raw12[..., j + 4] & 63
        else:
            sc[..., j] = (raw12[..., j + 4] & 0xF) | ((raw12[..., j - 4] >> 6) << 4)
            mn[..., j] = (raw12[..., j + 4] >> 4) | ((raw12[..., j] >> 6) << 4)
    return sc, mn


@dataclass
class Blocks:
    """Quantized rows as stored values and exact scales: ``w = scale·(u - zero) + minimum`` per group of ``group``
    inputs (32; Q6_K's scales: 16; minima always per 32). Scales are GGUF's own f16 (``d16``/``m16``) or, for the
    k-quants, a float32 per 256 inputs times a small integer (``sd·sc``, ``sm·mn``, exact in float32)."""

    u: np.ndarray  # [rows, n_in] uint8 (Q8_0: int8)
    bits: int  # 4, 5, 6 or 8
    zero: int
    d16: np.ndarray | None = None  # [rows, n_in/32] f16 bits
    m16: np.ndarray | None = None
    sd: np.ndarray | None = None  # [rows, n_in/256] float32
    sm: np.ndarray | None = None
    sc: np.ndarray | None = None  # [rows, n_in/32] uint8 (Q6_K: [rows, n_in/16] int8)
    mn: np.ndarray | None = None  # [rows, n_in/32] uint8

    @property
    def group(self) -> int:
        return 16 if self.bits == 6 else GROUP

    def scale(self) -> np.ndarray:
        if self.d16 is not None:
            return _f16(self.d16)
        return np.repeat(self.sd, self.sc.shape[1] // self.sd.shape[1], axis=1) * self.sc.astype(np.float32)  # type: ignore[union-attr]

    def minimum(self) -> np.ndarray | None:
        if self.m16 is not None:
            return _f16(self.m16)
        if self.mn is not None:
            return np.repeat(self.sm, 8, axis=1) * self.mn.astype(np.float32)  # type: ignore[arg-type]
        return None

    def dequantize(self) -> np.ndarray:
        rows, n = self.u.shape
        q = (self.u.astype(np.int16) - self.zero).astype(np.float32).reshape(rows, -1, self.group)
        w = (q * self.scale()[..., None]).reshape(rows, -1, GROUP)
        m = self.minimum()
        if m is not None:
            w = w + m[..., None]
        return w.reshape(rows, n)


def decode_blocks(type_name: str, raw: np.ndarray) -> Blocks:
    """The rows ``raw`` [rows, row bytes] of a quantized GGUF matrix as stored values and exact scales."""
    rows = raw.shape[0]
    if type_name == "Q8_0":
        b = raw.reshape(rows, -1, 34)
        return Blocks(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, -1), 8, 0, d16=_f16_bits(b, 0))
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[type_name]
        b = raw.reshape(rows, -1, size)
        has_m = type_name.endswith("_1")
        at = 4 if has_m else 2
        five = type_name.startswith("Q5")
        qs = b[..., at + 4 * five:]
        u = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        if five:
            qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")[..., 0]
            u |= (((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
        zero = 0 if has_m else (16 if five else 8)
        return Blocks(u.reshape(rows, -1), 5 if five else 4, zero, d16=_f16_bits(b, 0),
                      m16=_f16_bits(b, 2) if has_m else None)
    if type_name in ("Q4_K", "Q5_K"):
        five = type_name == "Q5_K"
        b = raw.reshape(rows, -1, 176 if five else 144)
        sc, mn = _k_scales(b[..., 4:16])
        qs = b[..., 48 if five else 16:].reshape(rows, -1, 4, 32)  # pairs of sub-blocks: low nibbles, high nibbles
        u = np.stack([qs & 0x0F, qs >> 4], axis=3)  # [rows, sb, 4, 2, 32]: sub-block 2i + e
        if five:
            shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)[:, :, None]
            u |= ((b[..., 16:48][:, :, None, None, :] >> shift) & 1) << 4
        return Blocks(u.reshape(rows, -1), 5 if five else 4, 0, sd=_f16(_f16_bits(b, 0)),
                      sm=-_f16(_f16_bits(b, 2)), sc=sc.reshape(rows, -1), mn=mn.reshape(rows, -1))
    if type_name == "Q6_K":
        b = raw.reshape(rows, -1, 210)
        ql = b[..., :128].reshape(rows, -1, 2, 2, 32)  # [half, a, l]: ql[64 half + 32 a + l]
        qh = b[..., 128:192].reshape(rows, -1, 2, 1, 32)
        low = np.stack([ql[..., 0, :] & 15, ql[..., 1, :] & 15, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], axis=3)
        high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
        u = low | (high << 4)  # [rows, sb, half, quarter, l]: input 128 half + 32 quarter + l
        return Blocks(u.reshape(rows, -1), 6, 32, sd=_f16(_f16_bits(b, 208)),
                      sc=np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(rows, -1))
    raise ValueError(f"no block decoder for {type_name}")


ENGINE_TYPES = {"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16"}
K_TYPES = {"Q4_K", "Q5_K", "Q6_K"}


@dataclass(frozen=True)
class Part:
    """Rows of one GGUF matrix in its own type: ``source`` [rows, row bytes] (a view of the mapped file), its rows
    taken in ``order`` when given (RoPE's pair order): ``raw``, made on first read. A model whose packed weights
    come from the cache never reads it, so reordered matrices cost no copy (Qwen2.5-0.5B's q and k: 15 MiB)."""

    type_name: str
    source: np.ndarray
    n_in: int
    order: np.ndarray | None = None

    @functools.cached_property
    def raw(self) -> np.ndarray:
        """The rows as the matrix has them: [rows, row bytes] blocks of ``type_name``."""
        return self.source if self.order is None else self.source[self.order]

    @property
    def rows(self) -> int:
        return int(self.source.shape[0] if self.order is None else len(self.order))

    def blocks(self, start: int = 0, stop: int | None = None) -> Blocks:
        return decode_blocks(self.type_name, self.raw[start:stop])

    def dequantize(self) -> np.ndarray:
        """float32 [rows, n_in]; the 4- and 8-bit types exactly as their unpacked forms give them. Decoded a few
        thousand rows at a time: the only full-size array is the result."""
        out = np.empty((self.rows, self.n_in), dtype=np.float32)
        raw = self.raw
        for r in range(0, self.rows, DEQUANT_ROWS):
            out[r:r + DEQUANT_ROWS] = self._dequantize(raw[r:r + DEQUANT_ROWS])
        return out

    def _dequantize(self, raw: np.ndarray) -> np.ndarray:
        t, rows = self.type_name, raw.shape[0]
        if t in INT4_TYPES:
            q, d, m = q4k_unpack(raw) if t == "Q4_K" else q4_unpack(raw, t)
            return (q.astype(np.float32).reshape(rows, -1, GROUP) * d[:, :, None] + m[:, :, None]).reshape(q.shape)
        if t in INT8_TYPES:
            q, d = q8_unpack(raw, t)
            return (q.astype(np.float32).reshape(rows, -1, GROUP) * d[:, :, None]).reshape(q.shape)
        if t == "F16":
            return raw.view(np.float16).astype(np.float32)
        if t == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return decode_blocks(t, raw).dequantize()


DEQUANT_ROWS = 4096


class Linear:
    """y = x @ W.T for one weight matrix [out, in]: 4-bit (int4 kernel on CPU), 8-bit or dense float32.

    ``parts`` keep the GGUF rows as stored (file-backed), for the CPU engine to pack in their own form; ``q4`` / ``q8``
    are the exact 4- and 8-bit forms (given, or unpacked from the parts on each use, not kept); ``int4_dtype`` is the
    torch int4 kernel's activation dtype (float32 exact, bfloat16 fast where its float32 path is slow); None runs the
    dequantized matrix."""

    def __init__(self, dense: torch.Tensor | None = None, *,
                 q4: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                 q8: tuple[np.ndarray, np.ndarray] | None = None, int4_dtype: torch.dtype | None = None,
                 parts: list[Part] | tuple[Part, ...] | None = None) -> None:
        self.weight = dense
        self.parts = tuple(parts) if parts else None
        self._q4, self._q8 = q4, q8
        self.int4_dtype = int4_dtype if self.has_q4 else None
        self._packed: tuple[torch.Tensor, torch.Tensor] | None = None
        self.engine_form: tuple[Any, list] | None = None  # the CPU engine's packed form, shared by its variants

    def _parts_in(self, types: set[str]) -> bool:
        return self.parts is not None and all(p.type_name in types for p in self.parts)

    @property
    def has_q4(self) -> bool:
        return self._q4 is not None or self._parts_in(INT4_TYPES)

    @property
    def q4(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if self._q4 is not None or not self._parts_in(INT4_TYPES):
            return self._q4
        forms = [q4k_unpack(p.raw) if p.type_name == "Q4_K" else q4_unpack(p.raw, p.type_name)
                 for p in self.parts]  # type: ignore[union-attr]
        return tuple(np.concatenate([f[i] for f in forms]) for i in range(3))  # type: ignore[return-value]

    @property
    def q8(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self._q8 is not None or not self._parts_in(INT8_TYPES):
            return self._q8
        forms = [q8_unpack(p.raw, p.type_name) for p in self.parts]  # type: ignore[union-attr]
        return tuple(np.concatenate([f[i] for f in forms]) for i in range(2))  # type: ignore[return-value]

    @property
    def form(self) -> str:
        """How the weights are kept: the GGUF types of the parts ("Q4_K+Q6_K"), else q4, q8 or f32."""
        if self.parts is not None:
            return "+".join(sorted({p.type_name for p in self.parts}))
        return "q4" if self._q4 is not None else "q8" if self._q8 is not None else "f32"

    @property
    def shape(self) -> tuple[int, int]:
        if self.parts is not None:
            return sum(p.rows for p in self.parts), self.parts[0].n_in
        src = self._q4[0] if self._q4 is not None else self._q8[0] if self._q8 is not None else self.weight
        return int(src.shape[0]), int(src.shape[1])  # type: ignore[union-attr]

    def with_int4_dtype(self, dtype: torch.dtype | None) -> Linear:
        """The same linear on torch's int4 kernel with ``dtype`` activations (None: the dequantized matrix)."""
        return self if not self.has_q4 else Linear(self.weight, q4=self._q4, parts=self.parts, int4_dtype=dtype)

    @staticmethod
    def concat(parts: list[Linear]) -> Linear:
        """One linear computing several with the same input (q|k|v, gate|up), to save kernel calls: the parts'
        GGUF rows when they all have them, else their shared exact form, else dense."""
        if all(p.parts is not None for p in parts):
            return Linear(parts=[x for p in parts for x in p.parts],  # type: ignore[union-attr]
                          int4_dtype=parts[0].int4_dtype)
        if all(p._q4 is not None for p in parts):
            q4 = tuple(np.concatenate([p._q4[i] for p in parts]) for i in range(3))  # type: ignore[index]
            return Linear(q4=q4, int4_dtype=parts[0].int4_dtype)  # type: ignore[arg-type]
        if all(p._q8 is not None for p in parts):
            return Linear(q8=tuple(np.concatenate([p._q8[i] for p in parts]) for i in range(2)))  # type: ignore[arg-type,index]
        return Linear(torch.cat([p.dense_weight() for p in parts]))

    def _dequantized(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        if self.parts is not None:
            ws = [p.dequantize() for p in self.parts]
            return torch.from_numpy(np.ascontiguousarray(np.concatenate(ws) if len(ws) > 1 else ws[0]))
        if self._q4 is not None:
            q, d, m = self._q4
            w = q.astype(np.float32).reshape(q.shape[0], -1, GROUP) * d[:, :, None] + m[:, :, None]
        else:
            q, d = self._q8  # type: ignore[misc]
            w = q.astype(np.float32).reshape(q.shape[0], -1, GROUP) * d[:, :, None]
        return torch.from_numpy(w.reshape(q.shape))

    def dense_weight(self) -> torch.Tensor:
        """The dequantized matrix (computed once and kept)."""
        if self.weight is None:
            self.weight = self._dequantized()
        return self.weight

    def dense(self) -> Linear:
        """The dequantized linear (this one does not keep the matrix unless it already had it)."""
        return Linear(self._dequantized())

    def _int4(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._packed is None:
            q, d, m = self.q4  # type: ignore[misc]
            packed = torch._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1)
            sz = np.stack([d, m + 8.0 * d], axis=-1).transpose(1, 0, 2)
            self._packed = packed, torch.from_numpy(np.ascontiguousarray(sz)).to(self.int4_dtype)
        return self._packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.int4_dtype is not None and x.device.type == "cpu":
            packed, scales = self._int4()
            return torch._weight_int4pack_mm_for_cpu(x.to(scales.dtype), packed, GROUP, scales).to(torch.float32)
        w = self.dense_weight()
        if w.device != x.device:
            w = self.weight = w.to(x.device)
        return torch.nn.functional.linear(x, w)


class WeightLoader:
    """Reads named tensors of a GGUF file as torch tensors / ``Linear``s."""

    def __init__(self, gguf: GGUFFile, *, int4: bool = True, device: torch.device | None = None) -> None:
        self.gguf = gguf
        self.device = device or torch.device("cpu")
        self.quantized = int4 and self.device.type == "cpu"
        self._noticed: set[str] = set()  # types already announced as dequantized

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def tensor(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.gguf.dequantize(name)).to(self.device)

    def linear(self, name: str, rows: np.ndarray | None = None) -> Linear:
        """The weight matrix ``name`` as a Linear; ``rows`` reorders its output rows."""
        info = self.gguf.info(name)
        kind = info.type_name
        if (self.quantized and len(info.shape) == 2 and kind in ENGINE_TYPES
                and info.shape[1] % (256 if kind in K_TYPES else GROUP) == 0):
            raw = self.gguf.raw(name)
            raw = raw if raw.dtype == np.uint8 else raw.view(np.uint8)  # F16: its bytes
            return Linear(parts=[Part(kind, raw, int(info.shape[1]), rows)],
                          int4_dtype=torch.float32 if kind in INT4_TYPES else None)
        if self.quantized and kind not in ENGINE_TYPES and kind != "F32" and kind not in self._noticed:
            self._noticed.add(kind)
            print(f"notice: {os.path.basename(self.gguf.path)}: {kind} weights have no kernel of their own here; "
                  "dequantized to float32 at load", file=sys.stderr)
        w = self.tensor(name)
        return Linear(w if rows is None else w[torch.from_numpy(rows)].contiguous())

    def linears(self, names: list[str], rows: list[np.ndarray | None] | None = None) -> Linear:
        """Several linears with one input, fused into one when they share a representation."""
        return Linear.concat([self.linear(n, r) for n, r in zip(names, rows or [None] * len(names), strict=False)])
