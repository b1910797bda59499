"""The compiled CPU engine: the whole forward step in one C call (``csrc/engine.c``), batch-invariant.

Linears keep their GGUF form (Q4_0/Q4_1 as 4-bit, Q8_0/Q5_0 as 8-bit, other types dequantized) in tiles of 16 output
rows; activations are quantized per 32-block, as llama.cpp does, but to 16 bits rather than 8, and multiplied in
integers (exact int32 block sums): the logits stay ~100x closer to the dequantized model than with 8-bit activations,
at a small cost in prompt speed (decode is bound by reading the weights). Each output
value is reduced in an order fixed by the model's shapes alone, so a token's logits are bitwise the same whether it
is decoded alone, in a prompt batch, or beside other sequences.

The library is compiled with the machine's C compiler into the user's cache directory on first use (``make setup``
does it at install), with ``-march=native``: it is built for the machine it runs on, never downloaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import resources

import numpy as np
import torch

from samplechain.runtime.kv_cache import KVCache
from samplechain.runtime.model import Rope, Transformer
from samplechain.runtime.weights import GROUP, Linear

TILE = 16
F32, W4, W8 = 0, 1, 2
ISAS = {"generic": 0, "avx2": 1, "avx512vnni": 2}
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-fPIC", "-shared"]


class EngineUnavailable(RuntimeError):
    """The C engine cannot be built or loaded here (no compiler, unsupported platform)."""


def cache_dir() -> str:
    """Where samplechain keeps per-machine files: ``$SAMPLECHAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/samplechain``
    (``~/.cache/samplechain``); a temporary folder where that cannot be written."""
    explicit = os.environ.get("SAMPLECHAIN_CACHE_DIR")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = explicit or os.path.join(base, "samplechain")
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"samplechain-{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(fallback, exist_ok=True)
    return fallback


def machine_id() -> str:
    """The CPU this process runs on (model name and feature flags), for per-machine caches."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _source() -> bytes:
    return resources.files("samplechain.runtime").joinpath("csrc/engine.c").read_bytes()


def source_hash() -> str:
    return hashlib.sha256(_source() + " ".join(CFLAGS).encode()).hexdigest()[:16]


_LIB: ctypes.CDLL | None = None


def build(verbose: bool = False) -> str:
    """Compile the engine for this machine (once; cached by source and CPU). Returns the library's path."""
    folder = os.path.join(cache_dir(), "kernels")
    path = os.path.join(folder, f"engine-{source_hash()}-{machine_id()}.so")
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or sys.platform == "win32":
        raise EngineUnavailable("no C compiler (cc/gcc) to build the CPU engine")
    os.makedirs(folder, exist_ok=True)
    fd, src = tempfile.mkstemp(suffix=".c", dir=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(_source())
    tmp = src[:-2] + ".so"
    try:
        proc = subprocess.run([cc, *CFLAGS, "-o", tmp, src, "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise EngineUnavailable(f"building the CPU engine failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)  # atomic: concurrent builders each write their own temporary file
    finally:
        for leftover in (src, tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
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
        _LIB = lib
    return _LIB


def supported_isas() -> list[str]:
    """The kernel variants this CPU can run (each is then timed; none is chosen from a flag alone)."""
    lib = library()
    return [name for name, code in ISAS.items() if lib.sc_isa_supported(code)]


# --- weights in the engine's layouts ------------------------------------------------------------------------------

class CLinear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("n_out", ctypes.c_int32), ("n_in", ctypes.c_int32),
                ("pad", ctypes.c_int32), ("q", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("unused", ctypes.c_void_p)]


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
                ("output", CLinear), ("attn_softcap", ctypes.c_float), ("pad", ctypes.c_float)]


def _tiles(a: np.ndarray, n_out: int) -> np.ndarray:
    """[n_out, ...] -> [tiles, 16, ...]"""
    return a.reshape(n_out // TILE, TILE, *a.shape[1:])


def pack_linear(lin: Linear, keep: list[np.ndarray]) -> CLinear:
    """The engine's form of ``lin`` (arrays appended to ``keep``, which must outlive the struct)."""
    n_out, n_in = lin.shape
    if n_out % TILE or n_in % GROUP:
        raise EngineUnavailable(f"a {n_out} x {n_in} matrix does not tile by {TILE} x {GROUP}")
    nb = n_in // GROUP
    d = m = None
    if lin.q4 is not None:
        q, dd, mm = lin.q4
        t = _tiles(q, n_out).reshape(n_out // TILE, TILE, nb, 4, 2, 4)  # [t, r, b, k, low/high, i]
        packed = (t[..., 0, :] | (t[..., 1, :] << 4)).astype(np.uint8).transpose(0, 2, 3, 1, 4)  # [t, b, k, r, i]
        kind, data = W4, np.ascontiguousarray(packed)
        d = np.ascontiguousarray(_tiles(dd, n_out).transpose(0, 2, 1), dtype=np.float32)
        m = np.ascontiguousarray(_tiles(mm, n_out).transpose(0, 2, 1), dtype=np.float32)
    elif lin.q8 is not None:
        q, dd = lin.q8
        t = _tiles(q, n_out).reshape(n_out // TILE, TILE, nb, 8, 4)  # [t, r, b, k, i]
        kind, data = W8, np.ascontiguousarray(t.transpose(0, 2, 3, 1, 4))
        d = np.ascontiguousarray(_tiles(dd, n_out).transpose(0, 2, 1), dtype=np.float32)
    else:
        w = lin.dense_weight().detach().cpu().numpy().astype(np.float32, copy=False)
        kind, data = F32, np.ascontiguousarray(_tiles(w, n_out).transpose(0, 2, 1))
    keep.extend(a for a in (data, d, m) if a is not None)

    def ptr(a: np.ndarray | None) -> int | None:
        return None if a is None else a.ctypes.data

    return CLinear(kind, n_out, n_in, 0, ptr(data), ptr(d), ptr(m), None)


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
        if isa not in ISAS:
            raise ValueError(f"unknown kernel variant {isa!r} (one of {', '.join(ISAS)})")
        lib = library()
        if not lib.sc_isa_supported(ISAS[isa]):
            raise EngineUnavailable(f"this CPU cannot run the {isa} kernels")
        self.isa, self._lib = isa, lib
        c = transformer.config
        if c.head_dim % 16 or c.n_embd % GROUP:
            raise EngineUnavailable("head_dim must be a multiple of 16 and n_embd of 32")
        self._keep: list = []
        k = self._keep
        layers = (CLayer * c.n_layer)()
        for i, L in enumerate(transformer.layers):
            layers[i] = CLayer(
                _ptr(L.attn_norm, k), _ptr(L.ffn_norm, k), _ptr(L.q_norm, k), _ptr(L.k_norm, k),
                _ptr(L.post_attn_norm, k), _ptr(L.post_ffn_norm, k), pack_linear(L.qkv, k), pack_linear(L.wo, k),
                pack_linear(L.gate_up, k), pack_linear(L.down, k), int(i in c.swa_layers), 0,
                _ptr(L.qkv_bias, k))
        self._layers = layers
        self.model = CModel(c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
                            int(c.gelu), c.rms_eps, c.attn_scale, 0, ISAS[isa], layers,
                            _ptr(transformer.output_norm, k), pack_linear(transformer.output, k), c.attn_softcap, 0.0)

    @staticmethod
    def _rope(positions: np.ndarray, head_dim: int, rope: Rope) -> tuple[np.ndarray, np.ndarray]:
        rot = rope.rotation(torch.from_numpy(positions), head_dim)[:, 0]
        return (np.ascontiguousarray(rot.real.numpy(), dtype=np.float32),
                np.ascontiguousarray(rot.imag.numpy(), dtype=np.float32))

    def compute(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        c = transformer.config
        if cache.k.dtype != torch.float32 or cache.k.device.type != "cpu" or not cache.k.is_contiguous():
            raise ValueError("the C engine needs a contiguous float32 KV cache on the CPU")
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
        return transformer.softcap(torch.from_numpy(logits))

    def linear(self, lin: Linear, x: np.ndarray) -> np.ndarray:
        """One linear on float rows [n, in] with this engine's kernels (for tests)."""
        keep: list = []
        packed = pack_linear(lin, keep)
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty((x.shape[0], packed.n_out), dtype=np.float32)
        self._lib.sc_linear_forward(ctypes.byref(packed), x.shape[0], ctypes.c_void_p(x.ctypes.data),
                                    ctypes.c_void_p(y.ctypes.data), ISAS[self.isa], torch.get_num_threads())
        return y


if __name__ == "__main__":  # `python -m samplechain.runtime.cpu_engine`: build now (make setup does)
    try:
        print(f"CPU engine: {build()} ({', '.join(supported_isas())})")
    except EngineUnavailable as e:
        print(f"CPU engine not built: {e}; the runtime will use torch's kernels", file=sys.stderr)
