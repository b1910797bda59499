"""Weights from GGUF as torch modules' raw material: 4-bit linears on torch's int4 kernel, dense ones otherwise.

A ``Linear`` keeps its weights in their GGUF form where that form is exact and useful: Q4_0 / Q4_1 as 4-bit
``(q, d, m)`` with ``w = d·q + m``, Q8_0 / Q5_0 as 8-bit ``(q, d)`` with ``w = d·q``; every other type is dequantized
once at load. The CPU engine (``cpu_engine.py``) packs these forms for its own kernels; the torch paths use them as:
Q4_0 / Q4_1 blocks map exactly onto ``torch._weight_int4pack_mm_for_cpu`` (group size 32): a block's nibbles are
its 4-bit values (low nibbles elements 0-15, high nibbles 16-31), and the kernel's per-group
``(scale, zero)`` with ``w = (q - 8)·scale + zero`` is ``(d, m + 8·d)`` (Q4_0: m = -8·d), packed on first use; 8-bit
forms run as their dequantized matrix. The int4 kernel is a private torch function: torch is pinned, and
``Linear.dense()`` keeps the dequantized path, which the tests compare against.
"""

from __future__ import annotations

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


class Linear:
    """y = x @ W.T for one weight matrix [out, in]: 4-bit (int4 kernel on CPU), 8-bit or dense float32.

    ``q4`` / ``q8`` keep the exact GGUF forms for the CPU engine; ``int4_dtype`` is the torch int4 kernel's activation
    dtype (float32 exact, bfloat16 fast where its float32 path is slow); None runs the dequantized matrix."""

    def __init__(self, dense: torch.Tensor | None = None, *,
                 q4: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                 q8: tuple[np.ndarray, np.ndarray] | None = None, int4_dtype: torch.dtype | None = None) -> None:
        self.weight = dense
        self.q4, self.q8 = q4, q8
        self.int4_dtype = int4_dtype if q4 is not None else None
        self._packed: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        src = self.q4[0] if self.q4 is not None else self.q8[0] if self.q8 is not None else self.weight
        return int(src.shape[0]), int(src.shape[1])  # type: ignore[union-attr]

    def with_int4_dtype(self, dtype: torch.dtype | None) -> Linear:
        """The same linear on torch's int4 kernel with ``dtype`` activations (None: the dequantized matrix)."""
        return self if self.q4 is None else Linear(self.weight, q4=self.q4, int4_dtype=dtype)

    @staticmethod
    def concat(parts: list[Linear]) -> Linear:
        """One linear computing several with the same input (q|k|v, gate|up), to save kernel calls: the parts'
        shared exact form when they have one, else dense."""
        if all(p.q4 is not None for p in parts):
            q4 = tuple(np.concatenate([p.q4[i] for p in parts]) for i in range(3))  # type: ignore[index]
            return Linear(q4=q4, int4_dtype=parts[0].int4_dtype)  # type: ignore[arg-type]
        if all(p.q8 is not None for p in parts):
            return Linear(q8=tuple(np.concatenate([p.q8[i] for p in parts]) for i in range(2)))  # type: ignore[arg-type,index]
        return Linear(torch.cat([p.dense_weight() for p in parts]))

    def dense_weight(self) -> torch.Tensor:
        """The dequantized matrix (computed once)."""
        if self.weight is None:
            if self.q4 is not None:
                q, d, m = self.q4
                w = q.astype(np.float32).reshape(q.shape[0], -1, GROUP) * d[:, :, None] + m[:, :, None]
            else:
                q, d = self.q8  # type: ignore[misc]
                w = q.astype(np.float32).reshape(q.shape[0], -1, GROUP) * d[:, :, None]
            self.weight = torch.from_numpy(w.reshape(q.shape))
        return self.weight

    def dense(self) -> Linear:
        return Linear(self.dense_weight())

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

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def tensor(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.gguf.dequantize(name)).to(self.device)

    def linear(self, name: str, rows: np.ndarray | None = None) -> Linear:
        """The weight matrix ``name`` as a Linear; ``rows`` reorders its output rows."""
        info = self.gguf.info(name)
        exact = self.quantized and len(info.shape) == 2 and info.shape[1] % GROUP == 0
        if exact and info.type_name in INT4_TYPES and (info.type_name != "Q4_K" or info.shape[1] % 256 == 0):
            raw = self.gguf.raw(name)
            q4 = q4k_unpack(raw) if info.type_name == "Q4_K" else q4_unpack(raw, info.type_name)
            return Linear(q4=q4 if rows is None else tuple(a[rows] for a in q4), int4_dtype=torch.float32)  # type: ignore[arg-type]
        if exact and info.type_name in INT8_TYPES:
            q8 = q8_unpack(self.gguf.raw(name), info.type_name)
            return Linear(q8=q8 if rows is None else tuple(a[rows] for a in q8))  # type: ignore[arg-type]
        w = self.tensor(name)
        return Linear(w if rows is None else w[torch.from_numpy(rows)].contiguous())

    def linears(self, names: list[str], rows: list[np.ndarray | None] | None = None) -> Linear:
        """Several linears with one input, fused into one when they share a representation."""
        return Linear.concat([self.linear(n, r) for n, r in zip(names, rows or [None] * len(names), strict=False)])
