"""GGUF files: header, metadata and tensor index parsed in one pass, tensor data memory-mapped.

The `gguf` package's reader builds a Python object per array element (seconds for a 262k-token vocabulary);
here string arrays are cut out of one ``bytes`` buffer and numeric arrays are NumPy views, so opening the
default model takes a few milliseconds. Dequantization uses the `gguf` package's kernels.
"""

from __future__ import annotations

import array
import mmap
import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9

# ggml tensor types this runtime knows: name, elements per block, bytes per block
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2),
}


def _learn_type(type_id: int) -> bool:
    """Add a ggml type the table above does not list (IQ and other rarer quantizations) from the `gguf` package,
    which can dequantize it; False when it does not know the type either."""
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        kind = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[kind]
    except (ImportError, ValueError, KeyError):
        return False
    GGML_TYPES[type_id] = (kind.name, block, size)
    return True


class GGUFError(ValueError):
    """The file is not a GGUF file this runtime can read (truncated, corrupt, unsupported)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]   # NumPy order (outermost first): ggml's ne reversed
    type_id: int
    offset: int              # from the start of the file

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type_id][0]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        _, block, size = GGML_TYPES[self.type_id]
        return self.n_elements // block * size


LAZY_STRINGS = 4096  # string arrays longer than this (a vocabulary's tokens and merges) are read on access


class StringArray(Sequence[str]):
    """A long GGUF string array read from the memory-mapped file on access: a vocabulary's 128k tokens and 280k
    merges held as Python strings take about 35 MB, and once the tokenizer is built from them nothing needs them.
    ``starts[i]``: where string i begins in the file; it ends 8 bytes (the next one's length) before the next."""

    __slots__ = ("_end", "_map", "_starts")

    def __init__(self, source: mmap.mmap, starts: np.ndarray, end: int) -> None:
        self._map, self._starts, self._end = source, starts, end

    def __len__(self) -> int:
        return len(self._starts)

    def _span(self, i: int) -> tuple[int, int]:
        n = len(self._starts)
        if not -n <= i < n:
            raise IndexError("string array index out of range")
        i %= n
        return int(self._starts[i]), self._end if i == n - 1 else int(self._starts[i + 1]) - 8

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        start, end = self._span(i)
        return self._map[start:end].decode("utf-8", errors="surrogateescape")

    def __iter__(self) -> Iterator[str]:
        if not len(self._starts):
            return
        base = int(self._starts[0])
        raw = self._map[base:self._end]  # one read of the span, then slices of it
        starts = (self._starts - base).tolist()
        ends = [s - 8 for s in starts[1:]] + [self._end - base]
        for start, end in zip(starts, ends, strict=True):
            yield raw[start:end].decode("utf-8", errors="surrogateescape")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


class _Cursor:
    """Reads little-endian values from a bytes-like buffer, with bounds checks that name the problem. With a
    ``source`` (the file's map, whose first bytes ``buf`` copies), long string arrays are ``StringArray``s of it."""

    def __init__(self, buf: memoryview, path: str, source: mmap.mmap | None = None) -> None:
        self.buf, self.pos, self.path, self.source = buf, 0, path, source

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated while reading {what} at byte {self.pos}")

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype, n = self.u32(what), self.u64(what)
            if etype in _NUMPY:
                dtype = np.dtype(_NUMPY[etype]).newbyteorder("<")
                self.need(n * dtype.itemsize, what)
                arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).copy()
                self.pos += n * dtype.itemsize
                return arr
            if etype == _STRING:
                return self.strings(n, what)
            return [self.value(etype, what) for _ in range(n)]
        raise GGUFError(f"{self.path}: unknown metadata type {vtype} in {what}")

    def strings(self, n: int, what: str) -> list[str] | StringArray:
        """``n`` strings: a ``StringArray`` of the file where there is one and they are many, else a list."""
        buf, pos = self.buf, self.pos
        unpack = struct.Struct("<Q").unpack_from
        end = len(buf)
        starts = array.array("q")
        for _ in range(n):
            if pos + 8 > end:
                raise GGUFError(f"{self.path}: truncated while reading {what}")
            (length,) = unpack(buf, pos)
            pos += 8
            if pos + length > end:
                raise GGUFError(f"{self.path}: truncated while reading {what}")
            starts.append(pos)
            pos += length
        self.pos = pos
        if self.source is not None and n > LAZY_STRINGS:
            return StringArray(self.source, np.frombuffer(starts, dtype=np.int64), pos)
        raw = buf.obj if isinstance(buf.obj, bytes) else bytes(buf)  # slicing bytes is faster than a memoryview
        ends = [s - 8 for s in starts[1:]] + [pos] if starts else []
        return [raw[s:e].decode("utf-8", errors="surrogateescape") for s, e in zip(starts, ends, strict=True)]


SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's llama_split_path: prefix-00001-of-00003.gguf


class GGUFFile:
    """One GGUF file: ``metadata`` (dict), ``tensors`` (name -> TensorInfo) and memory-mapped tensor data.

    A split model (llama.cpp's ``gguf-split``: ``name-00001-of-0000N.gguf``, each part with ``split.no`` /
    ``split.count`` metadata) opens from its first part: the metadata is the first part's, ``tensors`` those of every
    part (each read from its own file), as llama.cpp's ``llama_model_loader`` reads the parts named by
    ``llama_split_path``. ``_part``: opening a later part on its own, for the first one.
    """

    def __init__(self, path: str | os.PathLike[str], *, _part: bool = False) -> None:
        self.path = os.fspath(path)
        self._part_maps: dict[str, mmap.mmap] = {}  # tensor name -> the map of the part holding it (split models)
        self.parts: list[GGUFFile] = []  # a split model's later parts
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise GGUFError(f"{self.path}: not a GGUF file (only {size} bytes)")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from e
        self.size = size
        self._parse(size)
        if not _part:
            self._open_parts()

    def _open_parts(self) -> None:
        """A split model's later parts, next to the first (llama.cpp: ``split.count`` parts, named by
        ``llama_split_path``; a part other than the first is refused, as llama.cpp refuses it)."""
        count = int(self.metadata.get("split.count", 0) or 0)
        if count <= 1:
            return
        number = int(self.metadata.get("split.no", 0))
        name = SPLIT_NAME.match(os.path.basename(self.path))
        if number != 0:
            first = f"{name.group(1)}-00001-of-{count:05d}.gguf" if name else "its first part"
            raise GGUFError(f"{self.path}: part {number + 1} of a split model of {count}: load {first}")
        if name is None or int(name.group(3)) != count:
            raise GGUFError(f"{self.path}: the first part of a split model of {count}, but not named "
                            f"<prefix>-00001-of-{count:05d}.gguf, so its other parts cannot be found")
        folder = os.path.dirname(self.path)
        for i in range(2, count + 1):
            path = os.path.join(folder, f"{name.group(1)}-{i:05d}-of-{count:05d}.gguf")
            if not os.path.isfile(path):
                raise GGUFError(f"{self.path}: part {i} of {count} of the split model is missing: {path}")
            part = GGUFFile(path, _part=True)
            if int(part.metadata.get("split.no", -1)) != i - 1 or int(part.metadata.get("split.count", 0)) != count:
                raise GGUFError(f"{path}: not part {i} of {count} of {self.path} (split.no / split.count)")
            for tensor, info in part.tensors.items():
                if tensor in self.tensors:
                    raise GGUFError(f"{path}: tensor {tensor} is in two parts of the split model")
                self.tensors[tensor] = info
                self._part_maps[tensor] = part._map
            self.parts.append(part)
        expected = self.metadata.get("split.tensors.count")
        if expected is not None and int(expected) != len(self.tensors):
            raise GGUFError(f"{self.path}: the split model's parts hold {len(self.tensors)} tensors, "
                            f"split.tensors.count says {int(expected)}")

    def _parse(self, size: int) -> None:
        # The header is small next to the data: copy its first part into bytes (fast slicing), grow if needed.
        head = min(size, 1 << 24)
        while True:
            try:
                self._parse_header(memoryview(self._map[:head]), size)
                return
            except GGUFError:
                if head >= size:
                    raise
                head = min(size, head * 4)

    def _parse_header(self, buf: memoryview, size: int) -> None:
        cur = _Cursor(buf, self.path, self._map)
        cur.need(4, "magic")
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
        if n_tensors > size // 24 or n_kv > size // 12:
            raise GGUFError(f"{self.path}: implausible counts ({n_tensors} tensors, {n_kv} metadata entries)")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            meta[key] = cur.value(cur.u32(f"type of {key}"), key)
        self.metadata = meta
        infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.u32(f"dims of {name}")
            if n_dims > 4:
                raise GGUFError(f"{self.path}: tensor {name} has {n_dims} dimensions")
            dims = [cur.u64(f"shape of {name}") for _ in range(n_dims)]
            type_id, offset = cur.u32(f"type of {name}"), cur.u64(f"offset of {name}")
            infos.append((name, tuple(reversed(dims)), type_id, offset))
        align = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: alignment {align} is not a power of two")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, type_id, offset in infos:
            if type_id not in GGML_TYPES and not _learn_type(type_id):
                raise GGUFError(f"{self.path}: tensor {name} has unsupported ggml type {type_id}")
            info = TensorInfo(name, shape, type_id, self.data_offset + offset)
            if info.n_elements % GGML_TYPES[type_id][1]:
                raise GGUFError(f"{self.path}: tensor {name} shape {shape} does not fit {info.type_name} blocks")
            if info.offset + info.n_bytes > size:
                raise GGUFError(f"{self.path}: tensor {name} lies past the end of the file (truncated?)")
            self.tensors[name] = info

    # --- metadata helpers -------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: no general.architecture")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}`` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata {key} is missing")
        return self.metadata[key]

    # --- tensor data ------------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored (uint8 rows of blocks, or the float array for F32/F16/BF16), read-only."""
        info = self.info(name)
        kind, block, size = GGML_TYPES[info.type_id]
        buf = self._part_maps.get(name, self._map)  # info.offset is from the start of the part holding it
        if kind == "F32":
            return np.frombuffer(buf, np.float32, info.n_elements, info.offset).reshape(info.shape)
        if kind == "F16":
            return np.frombuffer(buf, np.float16, info.n_elements, info.offset).reshape(info.shape)
        row = info.shape[-1] // block * size
        return np.frombuffer(buf, np.uint8, info.n_bytes, info.offset).reshape(*info.shape[:-1], row)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in NumPy order."""
        info = self.info(name)
        kind = info.type_name
        data = self.raw(name)
        if kind == "F32":
            return np.array(data)
        if kind == "F16":
            return data.astype(np.float32)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize
        return dequantize(data, GGMLQuantizationType(info.type_id)).reshape(info.shape).astype(np.float32, copy=False)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name}") from None

    def release_pages(self) -> None:
        """Drop the file's pages from this process's memory (``MADV_DONTNEED``): once weights are packed into their
        own arrays, the pages they were read from would otherwise stay resident beside them. The mapping stays
        valid; a later read faults its pages back in from the page cache."""
        for f in (self, *self.parts):
            if hasattr(mmap, "MADV_DONTNEED") and not f._map.closed:
                f._map.madvise(mmap.MADV_DONTNEED)

    def release_tensor(self, name: str) -> None:
        """:meth:`release_pages` for one tensor's bytes (whole pages: a neighbour's pages at its ends go too, and
        come back from the page cache when read)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = self.info(name)
        buf = self._part_maps.get(name, self._map)
        if buf.closed:
            return
        start = info.offset - info.offset % mmap.PAGESIZE
        end = min(len(buf), info.offset + info.n_bytes)
        buf.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        for f in (self, *self.parts):
            f._map.close()
