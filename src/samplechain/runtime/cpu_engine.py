"""The compiled CPU engine: the whole forward step in one C call (``csrc/engine.c``), batch-invariant.

Linears keep their GGUF form (4-, 5-, 6- and 8-bit integers with GGUF's own scales for Q4_0/Q4_1/Q4_K, Q5_0/Q5_1/Q5_K,
Q6_K, Q8_0; F16/BF16 as halves; other types dequantized to float32) in tiles of 16 output rows, packed straight from
the mapped file's blocks, within ~6% of the file's size; activations are quantized per 32-block, as llama.cpp does,
but to 16 bits rather than 8, and multiplied in integers (exact int32 block sums): the logits stay ~100x closer to the
dequantized model than with 8-bit activations, at a small cost in prompt speed (decode is bound by reading the
weights). Each output value is reduced in an order fixed by the model's shapes alone, so a token's logits are bitwise
the same whether it is decoded alone, in a prompt batch, or beside other sequences.

The library is compiled with the machine's C compiler into the user's cache directory on first use (``make setup``
does it at install), with ``-march=native``: it is built for the machine it runs on, never downloaded.

It runs on its own pool of persistent worker threads (pthreads), one per process, not OpenMP: libgomp gives each
calling thread its own team, so decoding from a second thread (a web app's worker, a notebook's executor) once the
main thread had decoded doubled the spinning threads and slowed every step. With the pool, any thread may call, at
the same speed; calls from several threads at once take turns region by region. ``nt`` is torch's thread count.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import sys
import time
from importlib import resources

import numpy as np
import torch

from samplechain._native import BuildError, cache_dir, compile_c, machine_id
from samplechain.runtime import pack_cache
from samplechain.runtime.kv_cache import KVCache
from samplechain.runtime.model import Rope, Transformer
from samplechain.runtime.weights import ENGINE_TYPES, GROUP, Linear, Part

TILE = 16
MAX_HEAD_DIM = 512  # csrc/engine.c's attention converts a half row into a buffer of this size
MAX_GROUP = 64  # csrc/engine.c's attention: query heads per KV head
KV_DTYPES = (torch.float32, torch.float16)
F32, W4, W8, W5, W6, F16, BF16 = 0, 1, 2, 3, 4, 5, 6  # weight kinds
SF32, SF16, SK = 0, 1, 2  # how an integer kind's scales are kept
ISAS = {"generic": 0, "avx2": 1, "avx512vnni": 2, "amx": 5}  # 16-bit activations: one family, the same bits
Q8_ISAS = {"generic-q8": 3, "avx2-q8": 4}  # 8-bit activations (llama.cpp's numerics): their own family
ALL_ISAS = {**ISAS, **Q8_ISAS}
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-pthread", "-fPIC", "-shared"]


class EngineUnavailable(BuildError):
    """The C engine cannot be built or loaded here (no compiler, unsupported platform)."""


def _source() -> bytes:
    return resources.files("samplechain.runtime").joinpath("csrc/engine.c").read_bytes()


def source_hash() -> str:
    return hashlib.sha256(_source() + " ".join(CFLAGS).encode()).hexdigest()[:16]


_LIB: ctypes.CDLL | None = None


def build(verbose: bool = False) -> str:
    """Compile the engine for this machine (once; cached by source and CPU). Returns the library's path."""
    path = os.path.join(cache_dir(), "kernels", f"engine-{source_hash()}-{machine_id()}.so")
    try:
        compile_c(_source(), path, CFLAGS, "the CPU engine")
    except BuildError as e:
        raise EngineUnavailable(str(e)) from None
    if verbose:
        print(f"built {path}", file=sys.stderr)
    return path


def library() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(build())
        lib.sc_forward.restype = ctypes.c_int
        lib.sc_linear_forward.restype = ctypes.c_int
        lib.sc_isa_supported.restype = ctypes.c_int
        lib.sc_pool_workers.restype = ctypes.c_int  # the worker pool's size (tests)
        _LIB = lib
    return _LIB


def supported_isas(q8: bool = False) -> list[str]:
    """The kernel variants with 16-bit activations (``q8``: with 8-bit activations) this CPU can run (each is then
    timed; none is chosen from a flag alone)."""
    lib = library()
    return [name for name, code in (Q8_ISAS if q8 else ISAS).items() if lib.sc_isa_supported(code)]


# --- weights in the engine's layouts ------------------------------------------------------------------------------

class CLinear(ctypes.Structure):
    pass


CLinear._fields_ = [
    ("kind", ctypes.c_int32), ("n_out", ctypes.c_int32), ("n_in", ctypes.c_int32), ("pad", ctypes.c_int32),
    ("q", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p), ("unused", ctypes.c_void_p),
    ("zero", ctypes.c_int32), ("scales", ctypes.c_int32), ("sd", ctypes.c_void_p), ("sm", ctypes.c_void_p),
    ("next", ctypes.POINTER(CLinear))]


class CLayer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")] + [
                (name, CLinear) for name in ("qkv", "wo", "gate_up", "down")] + [
                ("swa", ctypes.c_int32), ("pad", ctypes.c_int32), ("qkv_bias", ctypes.c_void_p)]


class CModel(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in
                ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "gelu")] + [
                ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("kv_size", ctypes.c_int32),
                ("isa", ctypes.c_int32), ("layers", ctypes.POINTER(CLayer)), ("output_norm", ctypes.c_void_p),
                ("output", CLinear), ("attn_softcap", ctypes.c_float), ("kv_f16", ctypes.c_int32)]


def _tiles(a: np.ndarray, n_out: int) -> np.ndarray:
    """[n_out, ...] -> [tiles, 16, ...]"""
    return a.reshape(n_out // TILE, TILE, *a.shape[1:])


def _per_tile(a: np.ndarray) -> np.ndarray:
    """per-row groups [rows, groups] -> [tiles, groups, 16]"""
    return a.reshape(-1, TILE, a.shape[1]).transpose(0, 2, 1)


# GGUF type -> (engine kind, zero)
INT_KINDS = {"Q4_0": (W4, 8), "Q4_1": (W4, 0), "Q4_K": (W4, 0), "Q5_0": (W5, 16), "Q5_1": (W5, 0),
             "Q5_K": (W5, 0), "Q6_K": (W6, 32), "Q8_0": (W8, 0)}
CHUNK_ROWS = 256  # rows decoded and packed at a time: the transient copies stay small


def pack_values(u: np.ndarray, bits: int) -> np.ndarray:
    """Stored values [rows, n_in] (uint8; int8 for 8 bits) -> the engine's blocks [tiles, n_in/32, bytes]."""
    T, nb = u.shape[0] // TILE, u.shape[1] // GROUP
    if bits == 8:
        return u.view(np.uint8).reshape(T, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(T, nb, 512)
    t = u.reshape(T, TILE, nb, 4, 2, 4)  # [tile, r, b, k, e, i]: input 8k + 4e + i
    nib = (t[..., 0, :] & 15) | ((t[..., 1, :] & 15) << 4)  # [tile, r, b, k, i]
    out = [nib.transpose(0, 2, 3, 1, 4).reshape(T, nb, 256)]
    if bits == 5:  # byte 4r + i: bit 4 of input 8k + 4e + i at bit 2k + e
        shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)[:, :, None]
        plane = (((t >> 4) & 1) << shift).sum(axis=(3, 4), dtype=np.uint8)  # [tile, r, b, i]
        out.append(plane.transpose(0, 2, 1, 3).reshape(T, nb, 64))
    elif bits == 6:  # vector P, byte 4r + i: bits 4-5 of input 8(2P + h) + 4e + i at bits 2(2h + e)
        t6 = t.reshape(T, TILE, nb, 2, 2, 2, 4)  # [tile, r, b, P, h, e, i]
        shift = (2 * (2 * np.arange(2)[:, None] + np.arange(2)[None, :])).astype(np.uint8)[:, :, None]
        plane = ((t6 >> 4) << shift).sum(axis=(4, 5), dtype=np.uint8)  # [tile, r, b, P, i]
        out.append(plane.transpose(0, 2, 3, 1, 4).reshape(T, nb, 128))
    return np.concatenate(out, axis=-1) if len(out) > 1 else np.ascontiguousarray(out[0])


def _addr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def pack_part(part: Part, keep: list) -> CLinear:
    """One GGUF matrix's rows in the engine's form, decoded and packed CHUNK_ROWS rows at a time."""
    n_out, n_in, t = part.rows, part.n_in, part.type_name
    T, nb = n_out // TILE, n_in // GROUP
    if t in ("F16", "BF16"):
        data = np.empty((T, n_in, TILE), dtype=np.uint16)
        w = part.raw.view(np.uint16)
        for r in range(0, n_out, CHUNK_ROWS):
            rows = w[r:r + CHUNK_ROWS]
            data[r // TILE:(r + CHUNK_ROWS) // TILE] = _tiles(rows, len(rows)).transpose(0, 2, 1)
        keep.append(data)
        kind = F16 if t == "F16" else BF16
        return CLinear(kind, n_out, n_in, 0, _addr(data), None, None, None, 0, 0, None, None, None)
    kind, zero = INT_KINDS[t]
    first = part.blocks(0, TILE)
    data = np.empty((T, nb, {W4: 256, W5: 320, W6: 384, W8: 512}[kind]), dtype=np.uint8)
    k_quant = first.sd is not None
    if k_quant:
        d = np.empty((T, first.sc.shape[1], TILE), dtype=first.sc.dtype)  # type: ignore[union-attr]
        m = None if first.mn is None else np.empty((T, nb, TILE), dtype=np.uint8)
        sd = np.empty((T, n_in // 256, TILE), dtype=np.float32)
        sm = None if first.sm is None else np.empty_like(sd)
    else:
        d = np.empty((T, nb, TILE), dtype=np.uint16)
        m = None if first.m16 is None else np.empty_like(d)
        sd = sm = None
    for r in range(0, n_out, CHUNK_ROWS):
        b, s = part.blocks(r, r + CHUNK_ROWS), slice(r // TILE, (r + CHUNK_ROWS) // TILE)
        data[s] = pack_values(b.u, b.bits)
        if k_quant:
            d[s] = _per_tile(b.sc)
            sd[s] = _per_tile(b.sd)
            if m is not None:
                m[s], sm[s] = _per_tile(b.mn), _per_tile(b.sm)
        else:
            d[s] = _per_tile(b.d16)
            if m is not None:
                m[s] = _per_tile(b.m16)
    keep.extend(a for a in (data, d, m, sd, sm) if a is not None)
    return CLinear(kind, n_out, n_in, 0, _addr(data), _addr(d), _addr(m), None, zero, SK if k_quant else SF16,
                   _addr(sd), _addr(sm), None)


def pack_linear(lin: Linear, keep: list) -> CLinear:
    """The engine's form of ``lin`` (arrays and structs appended to ``keep``, which must outlive the struct): its
    GGUF parts each in their own form, chained by output rows; else its 4-/8-bit arrays; else float32. Packed once
    per linear: every kernel variant reads the same form (the variants differ in code only), so the engines built
    while the kernel is chosen share one copy of the weights."""
    if lin.engine_form is None:
        own: list = []
        lin.engine_form = (_pack_linear(lin, own), own)
    keep.append(lin.engine_form[1])
    return lin.engine_form[0]


def _pack_linear(lin: Linear, keep: list) -> CLinear:
    n_out, n_in = lin.shape
    if n_out % TILE or n_in % GROUP:
        raise EngineUnavailable(f"a {n_out} x {n_in} matrix does not tile by {TILE} x {GROUP}")
    if lin.parts is not None and all(p.type_name in ENGINE_TYPES and p.rows % TILE == 0 for p in lin.parts):
        chain = [pack_part(p, keep) for p in lin.parts]
        for a, b in itertools.pairwise(chain):
            a.next = ctypes.pointer(b)
        keep.extend(chain)
        return chain[0]
    nb = n_in // GROUP
    d = m = None
    if lin.q4 is not None:
        q, dd, mm = lin.q4
        t = _tiles(q, n_out).reshape(n_out // TILE, TILE, nb, 4, 2, 4)  # [t, r, b, k, low/high, i]
        packed = (t[..., 0, :] | (t[..., 1, :] << 4)).astype(np.uint8).transpose(0, 2, 3, 1, 4)  # [t, b, k, r, i]
        kind, data = W4, np.ascontiguousarray(packed)
        d = np.ascontiguousarray(_per_tile(dd), dtype=np.float32)
        m = np.ascontiguousarray(_per_tile(mm), dtype=np.float32)
    elif lin.q8 is not None:
        q, dd = lin.q8
        kind, data = W8, pack_values(q, 8)
        d = np.ascontiguousarray(_per_tile(dd), dtype=np.float32)
    else:
        w = lin.dense_weight().detach().cpu().numpy().astype(np.float32, copy=False)
        kind, data = F32, np.ascontiguousarray(_tiles(w, n_out).transpose(0, 2, 1))
    keep.extend(a for a in (data, d, m) if a is not None)
    return CLinear(kind, n_out, n_in, 0, _addr(data), _addr(d), _addr(m), None, 0, SF32, None, None, None)


def packed_bytes(keep: list) -> int:
    """The bytes of the arrays in a ``keep`` list (the engine's weights)."""
    return sum(a.nbytes for a in keep if isinstance(a, np.ndarray))


SEG_FIELDS = ("kind", "n_out", "n_in", "zero", "scales")
ARRAY_FIELDS = ("q", "d", "m", "sd", "sm")
ROLES = ("qkv", "wo", "gate_up", "down")


def _records(head: CLinear, own: list) -> list[dict]:
    """A packed linear's chain as records for ``pack_cache``: each segment's fields and arrays."""
    by_address = {a.ctypes.data: a for a in own if isinstance(a, np.ndarray) and a.size}
    segments, node = [], head
    while True:
        segments.append({"fields": {f: int(getattr(node, f)) for f in SEG_FIELDS},
                         "arrays": {f: by_address[getattr(node, f)] for f in ARRAY_FIELDS if getattr(node, f)}})
        if not node.next:
            return segments
        node = node.next.contents


def _from_records(segments: list[dict], own: list) -> CLinear:
    """The chain of CLinears over cached arrays (appended to ``own`` with the structs)."""
    chain = []
    for seg in segments:
        f, a = seg["fields"], seg["arrays"]
        chain.append(CLinear(f["kind"], f["n_out"], f["n_in"], 0, _addr(a.get("q")), _addr(a.get("d")),
                             _addr(a.get("m")), None, f["zero"], f["scales"], _addr(a.get("sd")), _addr(a.get("sm")),
                             None))
        own.extend(a.values())
    for x, y in itertools.pairwise(chain):
        x.next = ctypes.pointer(y)
    own.extend(chain)
    return chain[0]


def _model_files(transformer: Transformer) -> list[str]:
    return [transformer.source.path, *(part.path for part in transformer.source.parts)]


def _from_cache(transformer: Transformer, linears: list[Linear]) -> str | None:
    """Point every linear at its cached packed form when the model has a complete cache; returns the key to write
    the cache under when it should be written (None: loaded, disabled, or packed already)."""
    if not pack_cache.enabled() or any(lin.engine_form is not None for lin in linears):
        return None
    name = pack_cache.key(_model_files(transformer), machine_id())
    records = pack_cache.read(cache_dir(), name)  # views of the mapping, which keep it open
    if records is None or len(records) != len(linears):
        return name
    for lin, segments in zip(linears, records, strict=True):
        own: list = []
        lin.engine_form = (_from_records(segments, own), own)
    return None


def _pack_all(transformer: Transformer, linears: list[Linear]) -> int:
    """Pack every linear (the output matrix first, then layer by layer, dropping the file's pages read so far after
    each), with a progress line on stderr; returns the packed bytes."""
    start, total, shown = time.perf_counter(), 0, -1
    raw = sum(p.source.nbytes for lin in linears for p in lin.parts or ())
    say = raw >= pack_cache.MIN_BYTES  # small models pack in a blink: nothing to say
    tty = say and sys.stderr.isatty()
    per_layer = len(ROLES)
    for i, lin in enumerate(linears):
        pack_linear(lin, [])
        total += packed_bytes(lin.engine_form[1])  # type: ignore[index]
        if i % per_layer == 0:  # the output matrix, then each layer's last
            transformer.release_pages()  # the file's pages packed so far leave our memory
        pct = 100 * (i + 1) // len(linears)
        if tty and pct != shown:
            shown = pct
            print(f"\rpacking the weights for the CPU engine: {pct}%", end="", file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)
    if say:
        print(f"packed {len(linears)} matrices ({total / 2**20:.0f} MiB) for the CPU engine in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    return total


def _ptr(t: torch.Tensor | None, keep: list) -> int | None:
    if t is None:
        return None
    a = np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)
    keep.append(a)
    return a.ctypes.data


class CEngine:
    """The model's weights packed for the C forward, run with kernel variant ``isa``."""

    def __init__(self, transformer: Transformer, isa: str = "generic") -> None:
        if transformer.device.type != "cpu":
            raise EngineUnavailable("the C engine runs on the CPU")
        if isa not in ALL_ISAS:
            raise ValueError(f"unknown kernel variant {isa!r} (one of {', '.join(ALL_ISAS)})")
        lib = library()
        if not lib.sc_isa_supported(ALL_ISAS[isa]):
            raise EngineUnavailable(f"this CPU cannot run the {isa} kernels")
        self.isa, self._lib = isa, lib
        c = transformer.config
        if c.head_dim % 16 or c.n_embd % GROUP or c.head_dim > MAX_HEAD_DIM or c.n_head > MAX_GROUP * c.n_head_kv:
            raise EngineUnavailable(f"head_dim must be a multiple of 16 up to {MAX_HEAD_DIM}, n_embd of 32, and at "
                                    f"most {MAX_GROUP} query heads share a KV head")
        self._keep: list = []
        k = self._keep
        # the output matrix first (often the largest): its file pages leave memory before the layers are packed
        linears = [transformer.output, *(getattr(L, role) for L in transformer.layers for role in ROLES)]
        write_as = _from_cache(transformer, linears)
        if any(lin.engine_form is None for lin in linears):
            if _pack_all(transformer, linears) >= pack_cache.MIN_BYTES and write_as is not None:
                pack_cache.write(cache_dir(), write_as, [_records(*lin.engine_form) for lin in linears],
                                 _model_files(transformer))
        output = pack_linear(transformer.output, k)
        layers = (CLayer * c.n_layer)()
        for i, L in enumerate(transformer.layers):
            layers[i] = CLayer(
                _ptr(L.attn_norm, k), _ptr(L.ffn_norm, k), _ptr(L.q_norm, k), _ptr(L.k_norm, k),
                _ptr(L.post_attn_norm, k), _ptr(L.post_ffn_norm, k), pack_linear(L.qkv, k), pack_linear(L.wo, k),
                pack_linear(L.gate_up, k), pack_linear(L.down, k), int(i in c.swa_layers), 0,
                _ptr(L.qkv_bias, k))
        self._layers = layers
        self.model = CModel(c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
                            int(c.gelu), c.rms_eps, c.attn_scale, 0, ALL_ISAS[isa], layers,
                            _ptr(transformer.output_norm, k), output, c.attn_softcap, 0)

    @staticmethod
    def _rope(positions: np.ndarray, head_dim: int, rope: Rope) -> tuple[np.ndarray, np.ndarray]:
        rot = rope.rotation(torch.from_numpy(positions), head_dim)[:, 0]
        return (np.ascontiguousarray(rot.real.numpy(), dtype=np.float32),
                np.ascontiguousarray(rot.imag.numpy(), dtype=np.float32))

    def compute(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        _, logits = self._forward(transformer, cache, tokens, positions, cells, n_kv, masks, rows)
        return transformer.softcap(torch.from_numpy(logits))

    def compute_embeddings(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray,
                           positions: np.ndarray, cells: np.ndarray, n_kv: int,
                           masks: dict[int | None, np.ndarray]) -> torch.Tensor:
        """Every token's embedding: the C forward leaves the last layer's hidden states in its input buffer; they
        go through the output norm here. (The forward always ends in the LM head: the last token's logits are
        computed and dropped, a small part of the cost.)"""
        last = np.array([len(tokens) - 1], dtype=np.int64)
        x, _ = self._forward(transformer, cache, tokens, positions, cells, n_kv, masks, last)
        return transformer.final_norm(torch.from_numpy(x))

    def _forward(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                 cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
        """One C forward: the last layer's hidden states [n, n_embd] and the logits of ``rows`` [rows, n_vocab]."""
        c = transformer.config
        if (cache.k.dtype not in KV_DTYPES or cache.v.dtype not in KV_DTYPES or cache.k.device.type != "cpu"
                or not (cache.k.is_contiguous() and cache.v.is_contiguous())):
            raise ValueError("the C engine needs a contiguous float32 or float16 KV cache on the CPU")
        self.model.kv_f16 = int(cache.k.dtype == torch.float16) | 2 * int(cache.v.dtype == torch.float16)
        n = len(tokens)
        x = np.ascontiguousarray(transformer.tok_embd.rows(tokens), dtype=np.float32)
        if c.embed_scale != 1.0:
            x *= np.float32(c.embed_scale)
        glob = np.ascontiguousarray(masks[None]).view(np.uint8) if None in masks else None
        swa = np.ascontiguousarray(masks[c.swa_window]).view(np.uint8) if c.swa_window in masks else glob
        glob = swa if glob is None else glob  # every layer slides
        layer_ropes = [transformer.layer_rope(i, cache) for i in range(c.n_layer)]
        global_rope = next((r for i, r in enumerate(layer_ropes) if i not in c.swa_layers), layer_ropes[0])
        swa_rope = next((r for i, r in enumerate(layer_ropes) if i in c.swa_layers), global_rope)
        cos_g, sin_g = self._rope(positions, c.head_dim, global_rope)
        cos_s, sin_s = self._rope(positions, c.head_dim, swa_rope) if swa_rope != global_rope else (cos_g, sin_g)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        logits = np.empty((rows.size, c.n_vocab), dtype=np.float32)
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        self.model.kv_size = cache.k.shape[2]
        p = ctypes.c_void_p
        rc = self._lib.sc_forward(
            ctypes.byref(self.model), n, p(x.ctypes.data), p(cells.ctypes.data), n_kv, p(glob.ctypes.data),
            p(swa.ctypes.data), p(cos_g.ctypes.data), p(sin_g.ctypes.data), p(cos_s.ctypes.data),
            p(sin_s.ctypes.data), p(cache.k.data_ptr()), p(cache.v.data_ptr()), p(rows.ctypes.data), int(rows.size),
            p(logits.ctypes.data), torch.get_num_threads())
        if rc != 0:
            raise MemoryError("the C engine could not allocate its work buffers")
        return x, logits

    def linear(self, lin: Linear, x: np.ndarray) -> np.ndarray:
        """One linear on float rows [n, in] with this engine's kernels (for tests)."""
        return linear_forward(lin, x, self.isa)


def linear_forward(lin: Linear, x: np.ndarray, isa: str = "generic") -> np.ndarray:
    """One linear on float rows [n, in], packed now, with kernel variant ``isa`` (for tests and measurements)."""
    keep: list = []
    packed = pack_linear(lin, keep)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty((x.shape[0], lin.shape[0]), dtype=np.float32)
    rc = library().sc_linear_forward(ctypes.byref(packed), x.shape[0], ctypes.c_void_p(x.ctypes.data),
                                     ctypes.c_void_p(y.ctypes.data), ALL_ISAS[isa], torch.get_num_threads())
    if rc != 0:
        raise MemoryError("the C engine could not allocate its work buffers")
    return y

