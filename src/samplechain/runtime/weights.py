"""Weights from GGUF as torch modules' raw material: 4-bit linears on torch's int4 kernel, dense ones otherwise.

Q4_0 / Q4_1 blocks map exactly onto ``torch._weight_int4pack_mm_for_cpu`` (group size 32): a block's nibbles are
its 4-bit values (low nibbles elements 0-15, high nibbles 16-31), and the kernel's per-group
``(scale, zero)`` with ``w = (q - 8)·scale + zero`` is ``(d, m + 8·d)`` (Q4_0: m = -8·d). Every other type is
dequantized once at load. The int4 kernel is a private torch function: torch is pinned, and
``Linear.dense()`` keeps the dequantized path, which the tests compare against.
"""

from __future__ import annotations

import numpy as np
import torch

from samplechain.gguf import GGUFFile

INT4_TYPES = {"Q4_0", "Q4_1"}
GROUP = 32


def int4_compute_dtype() -> torch.dtype:
    """The activation dtype for the int4 kernel: float32 (exact) where the CPU kernel is vectorized for it
    (AVX-512), else bfloat16 (its float32 path is scalar on AVX2, ~15x slower)."""
    return torch.float32 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else torch.bfloat16


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


class Linear:
    """y = x @ W.T for one weight matrix [out, in]: int4-packed (CPU) or dense float32."""

    def __init__(self, dense: torch.Tensor | None = None, *, packed: torch.Tensor | None = None,
                 scales: torch.Tensor | None = None,
                 q4: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        self.weight = dense
        self.packed, self.scales, self._q4 = packed, scales, q4

    @classmethod
    def int4(cls, q: np.ndarray, d: np.ndarray, m: np.ndarray, dtype: torch.dtype | None = None) -> Linear:
        packed = torch._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1)
        sz = np.stack([d, m + 8.0 * d], axis=-1).transpose(1, 0, 2)
        scales = torch.from_numpy(np.ascontiguousarray(sz)).to(dtype or int4_compute_dtype())
        return cls(packed=packed, scales=scales, q4=(q, d, m))

    def with_compute_dtype(self, dtype: torch.dtype) -> Linear:
        """The same int4 linear with another activation dtype (float32 is exact, bfloat16 fast on AVX2)."""
        return self if self._q4 is None else Linear.int4(*self._q4, dtype=dtype)

    @staticmethod
    def concat(parts: list[Linear]) -> Linear:
        """One linear computing several with the same input (q|k|v, gate|up), to save kernel calls: int4 when
        every part is, else dense."""
        if all(p._q4 is not None for p in parts):
            return Linear.int4(*(np.concatenate([p._q4[i] for p in parts]) for i in range(3)))  # type: ignore[index]
        return Linear(torch.cat([p.dense_weight() for p in parts]))

    def dense_weight(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        q, d, m = self._q4  # type: ignore[misc]
        w = q.astype(np.float32).reshape(q.shape[0], -1, GROUP) * d[:, :, None] + m[:, :, None]
        return torch.from_numpy(w.reshape(q.shape))

    def dense(self) -> Linear:
        return self if self.packed is None else Linear(self.dense_weight())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            y = torch._weight_int4pack_mm_for_cpu(x.to(self.scales.dtype), self.packed, GROUP, self.scales)
            return y.to(torch.float32)
        return torch.nn.functional.linear(x, self.weight)


class WeightLoader:
    """Reads named tensors of a GGUF file as torch tensors / ``Linear``s."""

    def __init__(self, gguf: GGUFFile, *, int4: bool = True, device: torch.device | None = None) -> None:
        self.gguf = gguf
        self.device = device or torch.device("cpu")
        self.int4 = int4 and self.device.type == "cpu"

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def tensor(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.gguf.dequantize(name)).to(self.device)

    def linear(self, name: str, rows: np.ndarray | None = None) -> Linear:
        """The weight matrix ``name`` as a Linear; ``rows`` reorders its output rows."""
        info = self.gguf.info(name)
        if self.int4 and info.type_name in INT4_TYPES and len(info.shape) == 2 and info.shape[1] % GROUP == 0:
            q, d, m = q4_unpack(self.gguf.raw(name), info.type_name)
            if rows is not None:
                q, d, m = q[rows], d[rows], m[rows]
            return Linear.int4(q, d, m)
        w = self.tensor(name)
        return Linear(w if rows is None else w[torch.from_numpy(rows)].contiguous())

    def linears(self, names: list[str], rows: list[np.ndarray | None] | None = None) -> Linear:
        """Several linears with one input, fused into one when they share a representation."""
        parts = [self.linear(n, r) for n, r in zip(names, rows or [None] * len(names), strict=False)]
        if len({p.packed is None for p in parts}) == 1:
            return Linear.concat(parts)
        return Linear.concat([p.dense() for p in parts])
