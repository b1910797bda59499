"""The KV cache as llama.cpp keeps it: cells with a position and a set of owning sequences.

Cells hold one token's keys and values for every layer. Sequence operations only touch cell metadata;
position changes are recorded per cell as a pending ``shift`` and applied to the stored keys (RoPE re-rotation)
at the next decode, as llama.cpp's memory update does. Ranges are half-open ``[p0, p1)``; negative ``p0`` means
0 and negative ``p1`` means infinity. By default one stream (llama.cpp's unified cache) serves every sequence; with
``unified=False`` each sequence gets its own range of cells (llama.cpp's per-sequence streams), so a sequence's
cells, and with them its attention sums, are laid out the same whatever the other sequences do.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from samplechain.runtime.config import CACHE_TYPES_AS_F16, cache_type_error


class KVCacheFull(RuntimeError):
    """No free cells for a batch (and context shifting is off or not enough)."""


def _memory_bytes(device: torch.device) -> int | None:
    """The memory a cache could take on ``device``: the GPU's total, or this machine's physical memory."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[1])
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, RuntimeError, AttributeError):
        pass
    return None


KV_TYPES = {"f32": torch.float32, "f16": torch.float16}  # the types kept (runtime/config.py: CACHE_TYPES)


def kv_type(flag: str, name: str) -> tuple[torch.dtype, str | None]:
    """The dtype for a -ctk / -ctv value and a note when it is kept otherwise; ValueError for an unknown one."""
    if name in KV_TYPES:
        return KV_TYPES[name], None
    if name in CACHE_TYPES_AS_F16:
        return torch.float16, f"{flag} {name}: kept as f16 here (a 16-bit cache; {name} is not provided)"
    raise ValueError(cache_type_error(flag, name))


class KVCache:
    """Keys/values ``[n_layer, n_head_kv, size, head_dim]`` (``dtype`` / ``dtype_v``) plus per-cell ``pos``, ``seq``
    owners and ``shift``."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim_k: int, head_dim_v: int, size: int,
                 n_seq_max: int = 1, *, dtype: torch.dtype = torch.float32, dtype_v: torch.dtype | None = None,
                 device: torch.device | str = "cpu",
                 spare: int = 0, unified: bool = True):
        if size <= 0:
            raise ValueError(f"KV cache size must be positive, got {size}")
        if not 1 <= n_seq_max <= 256:
            raise ValueError(f"n_seq_max must be in [1, 256], got {n_seq_max}")
        self.size, self.n_seq_max = size, n_seq_max
        # ``spare`` cells past ``size`` are scratch space for padded rows (never allocated to tokens)
        cells = n_layer * n_head_kv * (size + spare)
        dtype_v = dtype if dtype_v is None else dtype_v
        need = cells * (head_dim_k * torch.empty((), dtype=dtype).element_size()
                        + head_dim_v * torch.empty((), dtype=dtype_v).element_size())
        have = _memory_bytes(torch.device(device))
        if have is not None and need > have:
            raise ValueError(f"a KV cache of {size} cells needs {need / 2**30:.1f} GiB, more than the "
                             f"{have / 2**30:.1f} GiB of {torch.device(device).type} memory: use a smaller context")
        try:
            self.k = torch.zeros(n_layer, n_head_kv, size + spare, head_dim_k, dtype=dtype, device=device)
            self.v = torch.zeros(n_layer, n_head_kv, size + spare, head_dim_v, dtype=dtype_v, device=device)
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            raise ValueError(f"a KV cache of {size} cells ({need / 2**30:.1f} GiB) cannot be allocated: "
                             f"{str(e).splitlines()[0]}") from None
        self.pos = np.full(size, -1, dtype=np.int64)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.shift = np.zeros(size, dtype=np.int64)
        self.has_shift = False
        self.head = 0
        self.unified = unified or n_seq_max == 1
        self.stream_size = size if self.unified else size // n_seq_max
        if self.stream_size < 1:
            raise ValueError(f"a KV cache of {size} cells cannot give {n_seq_max} sequences a stream each")

    # --- bookkeeping -------------------------------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    @property
    def n_attn(self) -> int:
        """Cells a query must look at: up to the last used one."""
        used = np.flatnonzero(self.pos >= 0)
        return int(used[-1]) + 1 if used.size else 0

    def check_seq(self, seq: int, allow_all: bool = False) -> None:
        """Refuse (``ValueError``) a sequence id that is not an integer in ``[0, n_seq_max)``; with ``allow_all``,
        -1 (every sequence, as llama.cpp's ``seq_rm`` takes it) passes too."""
        if allow_all and seq == -1:
            return
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq!r} is not in [0, {self.n_seq_max})")

    def _range(self, p0: int, p1: int) -> np.ndarray:
        lo = 0 if p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        return (self.pos >= lo) & (self.pos < hi)

    def _free(self, cells: np.ndarray) -> None:
        self.pos[cells] = -1
        self.seq[cells] = False
        self.shift[cells] = 0

    def clear(self) -> None:
        self._free(np.arange(self.size))
        self.has_shift = False
        self.head = 0

    def seq_pos_min(self, seq: int) -> int:
        self.check_seq(seq)
        p = self.pos[self.seq[:, seq]]
        return int(p.min()) if p.size else -1

    def seq_pos_max(self, seq: int) -> int:
        self.check_seq(seq)
        p = self.pos[self.seq[:, seq]]
        return int(p.max()) if p.size else -1

    def seq_positions(self, seq: int) -> np.ndarray:
        """Cells of ``seq`` ordered by position (for state files and tests)."""
        self.check_seq(seq)
        cells = np.flatnonzero(self.seq[:, seq])
        return cells[np.argsort(self.pos[cells], kind="stable")]

    # --- sequence operations (llama_memory_seq_*) --------------------------------------------------

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``seq`` from the cells in ``[p0, p1)``; ``seq == -1`` empties them whatever their owners."""
        self.check_seq(seq, allow_all=True)
        in_range = self._range(p0, p1)
        if seq == -1:
            freed = np.flatnonzero(in_range)
        else:
            owned = in_range & self.seq[:, seq]
            self.seq[owned, seq] = False
            freed = np.flatnonzero(owned & ~self.seq.any(axis=1))
        self._free(freed)
        if freed.size and freed[0] < self.head:
            self.head = int(freed[0])
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``dst`` an owner of ``src``'s cells in ``[p0, p1)`` (shared cells, no data copied)."""
        self.check_seq(src)
        self.check_seq(dst)
        if src == dst:
            return
        self.seq[self._range(p0, p1) & self.seq[:, src], dst] = True

    def seq_keep(self, seq: int) -> None:
        """Cells of ``seq`` keep only ``seq`` as owner; every other cell is emptied."""
        self.check_seq(seq)
        mine = self.seq[:, seq].copy()
        others = np.flatnonzero(~mine & (self.pos >= 0))
        self._free(others)
        self.seq[mine] = False
        self.seq[mine, seq] = True
        if others.size and others[0] < self.head:
            self.head = int(others[0])

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions of ``seq``'s cells in ``[p0, p1)`` by ``delta``; cells pushed below 0 are emptied."""
        self.check_seq(seq)
        if delta == 0:
            return
        cells = np.flatnonzero(self._range(p0, p1) & self.seq[:, seq])
        if cells.size == 0:
            return
        self.pos[cells] += delta
        self.shift[cells] += delta
        self.has_shift = True
        gone = cells[self.pos[cells] < 0]
        self._free(gone)
        self.head = int(gone[0]) if gone.size else 0

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide positions of ``seq``'s cells in ``[p0, p1)`` by ``d``.

        llama.cpp records the shift as ``old - new``, which rotates keys the wrong way; we record ``new - old``.
        """
        self.check_seq(seq)
        if d <= 0:
            raise ValueError(f"seq_div divisor must be positive, got {d}")
        if d == 1:
            return
        cells = np.flatnonzero(self._range(p0, p1) & self.seq[:, seq])
        if cells.size == 0:
            return
        old = self.pos[cells].copy()
        self.pos[cells] = old // d
        self.shift[cells] += self.pos[cells] - old
        self.has_shift = True

    # --- writing a batch ---------------------------------------------------------------------------

    def find_slot(self, n_tokens: int, seq_ids: list[tuple[int, ...]] | None = None) -> np.ndarray:
        """Cells for ``n_tokens`` new tokens: empty cells from ``head`` on, wrapping around (may be non-contiguous).
        Without a unified cache, each token takes the first empty cells of its (first) sequence's stream."""
        if not self.unified and seq_ids is not None:
            return self._find_in_streams(seq_ids)
        if n_tokens > self.size:
            raise KVCacheFull(f"a batch of {n_tokens} tokens does not fit a KV cache of {self.size} cells")
        if self.head > self.n_used + 2 * n_tokens:
            self.head = 0
        empty = self.pos < 0
        order = np.concatenate([np.flatnonzero(empty[self.head:]) + self.head, np.flatnonzero(empty[:self.head])])
        if order.size < n_tokens:
            raise KVCacheFull(f"KV cache full: {n_tokens} tokens need cells, {order.size} of {self.size} are free")
        return order[:n_tokens]

    def _find_in_streams(self, seq_ids: list[tuple[int, ...]]) -> np.ndarray:
        first = np.array([s[0] for s in seq_ids], dtype=np.int64)
        cells = np.empty(len(seq_ids), dtype=np.int64)
        for s in np.unique(first).tolist():
            self.check_seq(s)
            lo = s * self.stream_size
            rows = np.flatnonzero(first == s)
            empty = np.flatnonzero(self.pos[lo:lo + self.stream_size] < 0)
            if empty.size < rows.size:
                raise KVCacheFull(f"KV cache full: sequence {s} needs {rows.size} cells, {empty.size} of its "
                                  f"{self.stream_size} are free")
            cells[rows] = empty[:rows.size] + lo
        return cells

    def n_free(self, seq: int | None = None) -> int:
        """Empty cells left (for ``seq``'s stream when the cache is not unified)."""
        if self.unified or seq is None:
            return self.size - self.n_used
        lo = seq * self.stream_size
        return int(np.count_nonzero(self.pos[lo:lo + self.stream_size] < 0))

    def occupy(self, cells: np.ndarray, positions: np.ndarray, seq_ids: list[tuple[int, ...]]) -> None:
        """Record the metadata of a batch written to ``cells``."""
        for seqs in seq_ids:
            for s in seqs:
                self.check_seq(s)
        self.pos[cells] = positions
        self.seq[cells] = False
        self.shift[cells] = 0
        for cell, seqs in zip(cells.tolist(), seq_ids, strict=False):
            self.seq[cell, list(seqs)] = True
        self.head = int(cells[-1]) + 1 if cells.size else self.head
        if self.head >= self.size:
            self.head = 0

    def mask(self, positions: np.ndarray, seqs: np.ndarray, n_kv: int, window: int | None = None) -> np.ndarray:
        """Boolean [n_tokens, n_kv]: query i (position, first sequence) may attend to cell j."""
        pos = self.pos[:n_kv]
        allowed = self.seq[:n_kv, seqs].T & (pos[None, :] >= 0) & (pos[None, :] <= positions[:, None])
        if window is not None:
            allowed &= positions[:, None] - pos[None, :] < window
        return allowed

    # --- state -------------------------------------------------------------------------------------

    def take_shift(self) -> np.ndarray | None:
        """The pending per-cell shift (and clear it), or None when there is none."""
        if not self.has_shift:
            return None
        shift = self.shift.copy()
        self.shift[:] = 0
        self.has_shift = False
        return shift
