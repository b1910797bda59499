"""State files (prompt caches, server slots): KV cache cells and the token list, checked on load.

Layout: ``b"SCKV"``, u32 version, u32 header length, a JSON header (model identity, shapes, dtype, token ids,
cell count), then the cells' positions (int64), owner bits (uint8 [n_cells, n_seq_max]), keys and values
(``[n_layer, n_head_kv, n_cells, head_dim]`` each). A whole cache is saved with every used cell (``save_state``);
one sequence (a server slot) with its own cells only, as a file of one sequence (``save_seq_state``), which
``load_seq_state`` puts into any sequence of a cache. Loading refuses a file of another version, model, shape or
dtype, a truncated file and trailing bytes, with a ``StateError`` that says which.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from samplechain.runtime.kv_cache import KVCache, KVCacheFull

MAGIC = b"SCKV"
VERSION = 1


class StateError(ValueError):
    """A state file that cannot be loaded into this model and context."""


def _identity(model: Any) -> dict[str, Any]:
    c = model.config
    return {"arch": c.arch, "n_layer": c.n_layer, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim,
            "n_embd": c.n_embd, "n_vocab": c.n_vocab}


def _dtypes(cache: KVCache) -> dict[str, str]:
    """The cache's key and value types as a state file names them."""
    return {"dtype": str(cache.k.dtype).removeprefix("torch."), "dtype_v": str(cache.v.dtype).removeprefix("torch.")}


def _write(path: str | os.PathLike[str], model: Any, cache: KVCache, cells: np.ndarray, owners: np.ndarray,
           tokens: list[int]) -> int:
    """Write ``cells`` (in this order) with their ``owners`` bits and ``tokens``; returns the bytes written."""
    idx = torch.from_numpy(cells).to(cache.k.device)
    header = {**_identity(model), **_dtypes(cache), "n_seq_max": owners.shape[1], "n_cells": int(cells.size),
              "tokens": [int(t) for t in tokens]}
    head = json.dumps(header).encode()
    parts = [MAGIC, struct.pack("<II", VERSION, len(head)), head,
             cache.pos[cells].astype("<i8").tobytes(), owners.astype(np.uint8).tobytes(),
             cache.k[:, :, idx].contiguous().cpu().numpy().tobytes(),
             cache.v[:, :, idx].contiguous().cpu().numpy().tobytes()]
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
    os.replace(tmp, path)
    return sum(len(p) for p in parts)


def save_state(path: str | os.PathLike[str], model: Any, cache: KVCache, tokens: list[int]) -> int:
    """Write the cache's used cells and ``tokens``; returns the number of bytes written."""
    model.apply_kv_shift(cache)
    cells = np.flatnonzero(cache.pos >= 0)
    cells = cells[np.argsort(cache.pos[cells], kind="stable")]
    return _write(path, model, cache, cells, cache.seq[cells], tokens)


def save_seq_state(path: str | os.PathLike[str], model: Any, cache: KVCache, seq: int, tokens: list[int]) -> int:
    """Write sequence ``seq``'s cells and ``tokens`` as a file of one sequence; returns the bytes written."""
    model.apply_kv_shift(cache)
    cells = cache.seq_positions(seq)
    return _write(path, model, cache, cells, np.ones((cells.size, 1), dtype=bool), tokens)


@dataclass
class _Saved:
    """A state file's contents, checked against a model and cache."""

    tokens: list[int]
    pos: np.ndarray
    seq: np.ndarray  # owner bits [n_cells, n_seq]
    k: torch.Tensor
    v: torch.Tensor
    n_bytes: int


def _read(path: str, model: Any, cache: KVCache) -> _Saved:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise StateError(f"{path}: cannot read state file: {e.strerror}") from e
    if len(data) < 12 or data[:4] != MAGIC:
        raise StateError(f"{path}: not a samplechain state file")
    version, n_head = struct.unpack_from("<II", data, 4)
    if version != VERSION:
        raise StateError(f"{path}: state file version {version}, this build reads version {VERSION}")
    try:
        header = json.loads(data[12:12 + n_head])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateError(f"{path}: corrupt state header") from e
    if not isinstance(header, dict):
        raise StateError(f"{path}: corrupt state header")
    for key, value in _identity(model).items():
        if header.get(key) != value:
            raise StateError(f"{path}: saved for {key}={header.get(key)!r}, this model has {key}={value!r}")
    saved_types = {"dtype": header.get("dtype"), "dtype_v": header.get("dtype_v", header.get("dtype"))}
    if saved_types != _dtypes(cache):
        raise StateError(f"{path}: saved with keys / values of {saved_types['dtype']!r} / {saved_types['dtype_v']!r}, "
                         f"this cache keeps {_dtypes(cache)['dtype']!r} / {_dtypes(cache)['dtype_v']!r} (-ctk / -ctv)")
    n_cells, n_seq = header.get("n_cells"), header.get("n_seq_max")
    tokens = header.get("tokens")
    if not isinstance(n_cells, int) or not isinstance(n_seq, int) or not isinstance(tokens, list) \
            or not all(isinstance(t, int) and 0 <= t < model.config.n_vocab for t in tokens) \
            or n_cells < 0 or n_seq < 1:
        raise StateError(f"{path}: corrupt state header")
    if n_cells > cache.size:
        raise StateError(f"{path}: {n_cells} saved cells do not fit a context of {cache.size}")
    c = model.config
    kv_elems = c.n_layer * c.n_head_kv * n_cells * c.head_dim
    sizes = [n_cells * 8, n_cells * n_seq, kv_elems * cache.k.element_size(), kv_elems * cache.v.element_size()]
    if 12 + n_head + sum(sizes) != len(data):
        raise StateError(f"{path}: state file is {len(data)} bytes, expected {12 + n_head + sum(sizes)} (truncated?)")
    offset = 12 + n_head
    chunks = []
    for size in sizes:
        chunks.append(data[offset:offset + size])
        offset += size
    pos = np.frombuffer(chunks[0], dtype="<i8").astype(np.int64)
    seq = np.frombuffer(chunks[1], dtype=np.uint8).reshape(n_cells, n_seq).astype(bool)
    if (pos < 0).any() or (n_cells and not seq.any(axis=1).all()):
        raise StateError(f"{path}: corrupt cell metadata")
    shape = (c.n_layer, c.n_head_kv, n_cells, c.head_dim)
    k_dtype, v_dtype = (torch.empty(0, dtype=t.dtype).numpy().dtype for t in (cache.k, cache.v))
    k = torch.from_numpy(np.frombuffer(chunks[2], dtype=k_dtype).reshape(shape).copy())
    v = torch.from_numpy(np.frombuffer(chunks[3], dtype=v_dtype).reshape(shape).copy())
    return _Saved(tokens, pos, seq, k, v, len(data))


def load_state(path: str | os.PathLike[str], model: Any, cache: KVCache) -> list[int]:
    """Replace the cache's contents with the file's; returns the saved token list."""
    path = os.fspath(path)
    saved = _read(path, model, cache)
    n_cells, n_seq = saved.seq.shape
    if n_seq > cache.n_seq_max:
        raise StateError(f"{path}: saved with {n_seq} sequences, this context has {cache.n_seq_max}")
    cache.clear()
    cache.pos[:n_cells] = saved.pos
    cache.seq[:n_cells, :n_seq] = saved.seq
    cache.k[:, :, :n_cells] = saved.k.to(cache.k.device)
    cache.v[:, :, :n_cells] = saved.v.to(cache.v.device)
    cache.head = n_cells if n_cells < cache.size else 0
    return saved.tokens


def load_seq_state(path: str | os.PathLike[str], model: Any, cache: KVCache, seq: int) -> tuple[list[int], int]:
    """Replace sequence ``seq``'s cells with a file of one sequence (``save_seq_state``, or a one-sequence prompt
    cache) whose cells hold positions 0, 1, ... in order; returns the tokens those cells hold and the file's size.
    The other sequences keep their cells; ``seq`` is left empty when the file does not load."""
    path = os.fspath(path)
    cache.seq_rm(seq, -1, -1)
    saved = _read(path, model, cache)
    n_cells, n_seq = saved.seq.shape
    if n_seq != 1:
        raise StateError(f"{path}: holds {n_seq} sequences, a sequence is loaded from a file of one")
    if not np.array_equal(saved.pos, np.arange(n_cells)) or len(saved.tokens) < n_cells:
        raise StateError(f"{path}: corrupt cell metadata")
    try:
        cells = cache.find_slot(n_cells, [(seq,)] * n_cells)
    except KVCacheFull as e:
        raise StateError(f"{path}: {n_cells} saved cells do not fit: {e}") from None
    cache.occupy(cells, saved.pos, [(seq,)] * n_cells)
    idx = torch.from_numpy(cells).to(cache.k.device)
    cache.k[:, :, idx] = saved.k.to(cache.k.device)
    cache.v[:, :, idx] = saved.v.to(cache.v.device)
    return saved.tokens[:n_cells], saved.n_bytes
