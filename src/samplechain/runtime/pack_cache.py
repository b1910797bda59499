"""The CPU engine's packed weights, kept on disk and memory-mapped on the next load of the same model.

Packing a model's matrices into the engine's tiles (``cpu_engine.pack_part``) reads every weight and takes seconds on
a 1B model; llama.cpp only maps its file. The first load of a model writes what it packed to
``<cache dir>/packed/<key>.bin`` (the arrays, each 64-byte aligned) with ``<key>.json`` (where each array is and the
fields of each matrix's segments); later loads map that file read-only and point the engine at it: no packing, and the
pages are the page cache's, shared by every process that loads the model and dropped under memory pressure like the
model file's own.

The key is a hash of the layout version (``LAYOUT``: bumped whenever the packed form changes), the machine's CPU (the
form is the same on every CPU today; a future layout may not be), and each model file's identity: its device, inode,
size and modification time, and its first MiB (the GGUF header with the tensors' names, types and offsets). A file
replaced or rewritten gets a new key; hashing all of a multi-GB file would itself cost seconds. The index is written
last, by an atomic rename, so a cache is used only once complete; concurrent first loads each write their own and
the last rename wins. Each write first removes the caches of model files that are gone or changed, then the least
recently used ones while the folder holds more than ``SAMPLECHAIN_PACK_CACHE_GB`` (32). Models whose weights are
under ``MIN_BYTES`` are not cached. ``SAMPLECHAIN_PACK_CACHE=0`` turns the cache off (nothing read or written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable

import numpy as np

LAYOUT = "1"
ALIGN = 64
HEAD_BYTES = 1 << 20
MIN_BYTES = 64 << 20  # smaller models pack in well under a second: not cached
MAX_BYTES = int(float(os.environ.get("SAMPLECHAIN_PACK_CACHE_GB", "32")) * 2**30)  # the folder's bound (LRU)


def enabled() -> bool:
    return os.environ.get("SAMPLECHAIN_PACK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def identity(path: str) -> list:
    """What says a model file is unchanged: its absolute path, device, inode, size and modification time."""
    st = os.stat(path)
    return [os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def key(paths: Iterable[str], machine: str) -> str:
    """The cache key of a model made of the files ``paths`` (a split model: every part), on CPU ``machine``."""
    h = hashlib.sha256(f"layout {LAYOUT} | cpu {machine}".encode())
    for path in paths:
        h.update(json.dumps(identity(path)).encode())
        with open(path, "rb") as f:
            h.update(f.read(HEAD_BYTES))
    return h.hexdigest()[:32]


def _stale(index_path: str) -> bool:
    """Whether a cache's model files are gone or changed (an unreadable index is stale too)."""
    try:
        with open(index_path) as f:
            sources = json.load(f)["sources"]
        return any(identity(src[0]) != src for src in sources)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return True


def prune(where: str, incoming: int) -> None:
    """Remove caches of changed or vanished files, then the least recently used (by their index's access time,
    renewed on each read) until ``incoming`` more bytes fit under ``MAX_BYTES``."""
    entries = []
    for name in os.listdir(where):
        if not name.endswith(".json") or name.endswith(".tmp"):
            continue
        index, data = os.path.join(where, name), os.path.join(where, name[:-5] + ".bin")
        if _stale(index):
            for path in (index, data):
                with contextlib.suppress(OSError):
                    os.remove(path)
            continue
        with contextlib.suppress(OSError):
            entries.append((os.stat(index).st_mtime, os.path.getsize(data), index, data))
    used = sum(e[1] for e in entries)
    for _, size, index, data in sorted(entries):
        if used + incoming <= MAX_BYTES:
            break
        for path in (index, data):
            with contextlib.suppress(OSError):
                os.remove(path)
        used -= size


def folder(cache_dir: str) -> str:
    return os.path.join(cache_dir, "packed")


def read(cache_dir: str, name: str) -> list | None:
    """The matrices' records of cache ``name``, or None when there is none (or it is unreadable: it is then
    rebuilt). Each record is a list of segments ``{"fields": {...}, "arrays": {field: ndarray}}``, the arrays views
    of the mapped data (which they keep open)."""
    base = os.path.join(folder(cache_dir), name)
    try:
        with open(base + ".json") as f:
            index = json.load(f)
        if index.get("layout") != LAYOUT or os.path.getsize(base + ".bin") != index["size"]:
            return None
        data = np.memmap(base + ".bin", dtype=np.uint8, mode="r")
        os.utime(base + ".json")  # recently used (pruning drops the least recently used first)
    except (OSError, ValueError, KeyError):
        return None
    records = []
    for matrix in index["matrices"]:
        segments = []
        for seg in matrix:
            arrays = {}
            for field, (offset, dtype, shape) in seg["arrays"].items():
                count = int(np.prod(shape)) * np.dtype(dtype).itemsize
                arrays[field] = data[offset:offset + count].view(dtype).reshape(shape)
            segments.append({"fields": seg["fields"], "arrays": arrays})
        records.append(segments)
    return records


def write(cache_dir: str, name: str, records: list, sources: list[str]) -> None:
    """Write the matrices' records (segments with their arrays) as cache ``name`` of the model files ``sources``; a
    failure (disk full, read-only cache) is reported on stderr and leaves no partial cache."""
    where = folder(cache_dir)
    base = os.path.join(where, name)
    tmp_bin = tmp_json = None
    try:
        os.makedirs(where, exist_ok=True)
        prune(where, sum(a.nbytes for matrix in records for seg in matrix for a in seg["arrays"].values()))
        fd, tmp_bin = tempfile.mkstemp(suffix=".bin.tmp", dir=where)
        index: list = []
        offset = 0
        with os.fdopen(fd, "wb") as f:
            for matrix in records:
                segs = []
                for seg in matrix:
                    places = {}
                    for field, a in seg["arrays"].items():
                        pad = -offset % ALIGN
                        f.write(b"\0" * pad)
                        offset += pad
                        a = np.ascontiguousarray(a)
                        f.write(a.data)
                        places[field] = (offset, a.dtype.str, list(a.shape))
                        offset += a.nbytes
                    segs.append({"fields": seg["fields"], "arrays": places})
                index.append(segs)
        fd, tmp_json = tempfile.mkstemp(suffix=".json.tmp", dir=where)
        with os.fdopen(fd, "w") as f:
            json.dump({"layout": LAYOUT, "size": offset, "sources": [identity(p) for p in sources],
                       "matrices": index}, f)
        os.replace(tmp_bin, base + ".bin")
        tmp_bin = None
        os.replace(tmp_json, base + ".json")  # last: the cache exists once its index does
        tmp_json = None
    except OSError as e:
        print(f"note: the packed weights could not be cached in {where}: {e.strerror or e}", file=sys.stderr)
    finally:
        for leftover in (tmp_bin, tmp_json):
            if leftover and os.path.exists(leftover):
                os.remove(leftover)
