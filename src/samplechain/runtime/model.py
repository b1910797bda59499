"""Transformer forward in torch for the GGUF architectures we run, as llama.cpp builds their graphs: ``llama``
(Llama 2/3.x, Mistral, SmolLM2; Llama 3's ``rope_freqs``), ``qwen2`` (q/k/v biases), ``qwen3`` (q/k norms), ``phi3``
(fused qkv and gate|up, short/long rope factors), ``gemma2`` (soft-capping, alternating sliding-window layers, post
norms) and ``gemma3``.

Weights come straight from GGUF (see ``weights.py``). Tensors follow llama.cpp's conventions: llama's Q/K rows are
stored for the interleaved ("normal") RoPE, the others use NEOX RoPE, gemma's norm weights already include the +1.
A forward step takes a batch of tokens with positions and sequence ids, writes their keys/values into KV cells and
attends over the cells each token's sequence owns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from samplechain.gguf import GGUFError, GGUFFile
from samplechain.runtime.kv_cache import KVCache
from samplechain.runtime.weights import Linear, WeightLoader

ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
ATTN_CHUNK = 256  # cells per partial sum of attention on CUDA; CUDA caches and decode graphs' spans are multiples


class Engine(Protocol):
    """A forward step other than the eager torch path (the compiled CPU engine, CUDA graphs): the logits of the
    ``rows`` of a batch that ``Transformer.prepare`` has placed in ``cells`` of the cache, or every token's
    embedding (the final norm's output)."""

    def compute(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray,
                ) -> torch.Tensor: ...

    def compute_embeddings(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray,
                           positions: np.ndarray, cells: np.ndarray, n_kv: int,
                           masks: dict[int | None, np.ndarray]) -> torch.Tensor: ...


@dataclass(frozen=True)
class Rope:
    """One layer's rotary embedding as llama.cpp's ``ggml_rope_ext`` computes it (no YaRN extrapolation): pair ``i``
    of a head turns by ``position * freq_scale * base^(-2i/d) / factors[i]``, and cos/sin carry ``mscale``."""

    base: float
    freq_scale: float = 1.0
    factors: tuple[float, ...] | None = None
    mscale: float = 1.0

    def rotation(self, positions: torch.Tensor, head_dim: int, magnitude: bool = True) -> torch.Tensor:
        """Complex rotations [n, 1, head_dim/2] for (possibly negative) integer positions, angles in float64;
        ``magnitude`` False leaves out ``mscale`` (a K-shift turns keys that already carry it)."""
        angles = positions.to(torch.float64)[:, None] * inv_freq(self, head_dim, positions.device)[None, :]
        radius = torch.full_like(angles, self.mscale if magnitude else 1.0)
        return torch.polar(radius, angles).to(torch.complex64)[:, None, :]


@functools.cache
def inv_freq(rope: Rope, head_dim: int, device: torch.device) -> torch.Tensor:
    """A rotary embedding's angular frequencies [head_dim/2] (float64), made once per device: a CUDA graph's capture
    (which cannot copy from the host) finds them there."""
    freqs = rope.base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim) * rope.freq_scale
    if rope.factors is not None:
        freqs = freqs / torch.tensor(rope.factors, dtype=torch.float64)
    return freqs.to(device)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_neox: bool
    rope_base_swa: float = 10000.0
    swa_window: int | None = None
    swa_layers: frozenset[int] = field(default_factory=frozenset)
    attn_scale: float = 0.0
    embed_scale: float = 1.0
    rope_scale: float = 1.0  # llama.cpp's freq_scale (1 / rope.scaling.factor) of the global layers
    rope_scale_swa: float = 1.0
    rope_factors: tuple[float, ...] | None = None  # rope_freqs (Llama 3.x) or Phi-3's short factors
    rope_factors_long: tuple[float, ...] | None = None  # Phi-3's long factors, for contexts past n_ctx_orig
    rope_mscale: float = 1.0  # rope.scaling.attn_factor
    n_ctx_orig: int = 0
    attn_softcap: float = 0.0  # Gemma 2: scores = cap * tanh(scores / cap)
    final_softcap: float = 0.0  # Gemma 2 (and Gemma 3 when set): the same on the logits
    gelu: bool = False  # the feed-forward's gate activation: GELU (tanh form) for Gemma, SiLU otherwise

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> ModelConfig:
        arch = g.architecture
        if arch not in ARCHITECTURES:
            raise GGUFError(f"{g.path}: architecture {arch!r} is not supported (we run: {', '.join(ARCHITECTURES)})")

        def need(key: str) -> int | float:
            value = g.arch_get(key)
            if value is None:
                raise GGUFError(f"{g.path}: metadata {arch}.{key} is missing")
            return value

        def single(key: str, value: object) -> int:
            if isinstance(value, (list, tuple, np.ndarray)):  # per-layer arrays: we run uniform layers only
                values = {int(v) for v in value}
                if len(values) != 1:
                    raise GGUFError(f"{g.path}: {arch}.{key} differs between layers; not supported")
                return values.pop()
            return int(value)  # type: ignore[call-overload]

        n_embd = int(need("embedding_length"))
        n_head = single("attention.head_count", need("attention.head_count"))
        head_dim = int(g.arch_get("attention.key_length", n_embd // n_head))
        if int(g.arch_get("attention.value_length", head_dim)) != head_dim:
            raise GGUFError(f"{g.path}: keys and values of different sizes are not supported")
        if int(g.arch_get("rope.dimension_count", head_dim)) != head_dim:
            raise GGUFError(f"{g.path}: partial rotary embeddings (rope.dimension_count < head size) are not "
                            "supported")
        n_layer = int(need("block_count"))
        n_vocab = int(g.arch_get("vocab_size", len(g.get("tokenizer.ggml.tokens", ()))))
        n_ctx_train = int(need("context_length"))
        scaling = str(g.arch_get("rope.scaling.type", "linear"))
        factor = float(g.arch_get("rope.scaling.factor", g.arch_get("rope.scale_linear", 0.0)) or 0.0)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise GGUFError(f"{g.path}: rope scaling {scaling!r} is not supported (linear, rope_freqs factors)")
        rope_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
        rope_base = float(g.arch_get("rope.freq_base", 10000.0))

        def factors(name: str) -> tuple[float, ...] | None:
            if name not in g.tensors:
                return None
            values = g.dequantize(name).reshape(-1)
            if values.size != head_dim // 2:
                raise GGUFError(f"{g.path}: {name} has {values.size} factors, not {head_dim // 2}")
            return tuple(float(v) for v in values)

        gemma = arch in ("gemma2", "gemma3")
        cfg: dict = dict(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
            n_head_kv=single("attention.head_count_kv", g.arch_get("attention.head_count_kv", n_head)),
            head_dim=head_dim, n_ff=single("feed_forward_length", need("feed_forward_length")), n_vocab=n_vocab,
            n_ctx_train=n_ctx_train, rms_eps=float(need("attention.layer_norm_rms_epsilon")),
            rope_base=rope_base, rope_neox=arch != "llama", attn_scale=1.0 / math.sqrt(head_dim),
            rope_scale=rope_scale, rope_mscale=float(g.arch_get("rope.scaling.attn_factor", 1.0)),
            n_ctx_orig=int(g.arch_get("rope.scaling.original_context_length", n_ctx_train)),
            rope_factors=factors("rope_freqs.weight") or factors("rope_factors_short.weight"),
            rope_factors_long=factors("rope_factors_long.weight"), gelu=gemma,
        )
        if gemma:
            cfg["embed_scale"] = math.sqrt(n_embd)
            if n_layer in ((46, 62)[arch == "gemma3"],):  # the 27B models scale by n_embd / n_head (llama.cpp)
                cfg["attn_scale"] = 1.0 / math.sqrt(n_embd / n_head)
            cfg["final_softcap"] = float(g.arch_get("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0))
        if arch == "gemma2":
            cfg["attn_softcap"] = float(g.arch_get("attn_logit_softcapping", 50.0))
            window, pattern = int(g.arch_get("attention.sliding_window", 4096)), 2
            cfg.update(rope_base_swa=float(g.arch_get("rope.freq_base_swa", rope_base)), rope_scale_swa=rope_scale)
        elif arch == "gemma3" and g.arch_get("attention.sliding_window"):
            window, pattern = int(g.arch_get("attention.sliding_window")), 6
            cfg.update(rope_base_swa=float(g.arch_get("rope.freq_base_swa", 10000.0)), rope_scale_swa=1.0)
        else:
            # Phi-3 files name a window, but llama.cpp runs them without one (see its llama_model_phi3)
            return cls(**cfg)
        explicit = g.arch_get("attention.sliding_window_pattern")
        if isinstance(explicit, (list, tuple, np.ndarray)):
            swa = frozenset(i for i, on in enumerate(explicit) if on and i < n_layer)
        else:
            p = int(explicit) if explicit is not None else pattern
            swa = frozenset(i for i in range(n_layer) if p == 0 or i % p < p - 1)
        return cls(**cfg, swa_window=window, swa_layers=swa)

    def rope(self, layer: int, n_ctx: int = 0) -> Rope:
        """Layer ``layer``'s rotary embedding in a context of ``n_ctx`` cells per sequence (Phi-3's long factors
        past the original context, as llama.cpp chooses them)."""
        if layer in self.swa_layers:
            return Rope(self.rope_base_swa, self.rope_scale_swa, None, self.rope_mscale)
        long = self.rope_factors_long is not None and n_ctx > self.n_ctx_orig
        return Rope(self.rope_base, self.rope_scale, self.rope_factors_long if long else self.rope_factors,
                    self.rope_mscale)


@dataclass
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear
    wo: Linear
    ffn_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_ffn_norm: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None  # Qwen 2: q|k|v biases


EMBEDDING_CHUNK = 32  # token embedding rows read between two releases of the matrix's pages (Embedding.rows)


class Embedding:
    """The token embedding matrix in its GGUF form, memory-mapped: a lookup dequantizes only the rows it reads, as
    llama.cpp's ``get_rows`` does (on CUDA the matrix is dequantized once into device memory)."""

    def __init__(self, gguf: GGUFFile, name: str, device: torch.device) -> None:
        info = gguf.info(name)
        self.shape = info.shape
        self._raw, self._type = gguf.raw(name), info.type_id
        self._dense = torch.from_numpy(gguf.dequantize(name)).to(device) if device.type != "cpu" else None
        self._gguf, self._name = gguf, name

    def rows(self, tokens: np.ndarray) -> np.ndarray:
        """float32 rows [n, n_embd] of ``tokens``.

        The pages read leave this process's memory again, every ``EMBEDDING_CHUNK`` rows: each read maps the pages
        around it too (the kernel's fault-around, 64 KiB), so a 512-token prompt of distinct tokens had some 30 MiB
        of the matrix resident beside its packed copy (a tied output matrix) at its peak, for nothing; 32 rows at a
        time hold 2 MiB, and the lookup took 3 ms where one gather took 8 (Qwen 2.5's 152k x 896 Q8_0). A later read
        maps the pages again from the page cache. The rows are dequantized chunk by chunk too (the dequantizer's
        temporaries are a few times the rows' size)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        ids = np.asarray(tokens, dtype=np.int64)
        out = np.empty((len(ids), self.shape[-1]), dtype=np.float32)
        for i in range(0, len(ids), EMBEDDING_CHUNK):
            raw = self._raw[ids[i:i + EMBEDDING_CHUNK]]
            self._gguf.release_tensor(self._name)
            out[i:i + EMBEDDING_CHUNK] = (raw if raw.dtype != np.uint8 else dequantize(
                raw, GGMLQuantizationType(self._type)).reshape(len(raw), -1))
        return out

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._dense is not None:
            return self._dense[tokens]
        return torch.from_numpy(self.rows(tokens.numpy()))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:  # one fused kernel instead of six
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float, softcap: float = 0.0) -> torch.Tensor:
    """Attention of queries q [n, heads, d] over keys/values [kv_heads, cells, d] -> [n, heads * d].

    On the CPU, torch's fused attention with a boolean ``mask`` [n, cells]. On CUDA its kernels parallelise over
    queries and heads only, which leaves a decode step (one query per sequence) with a handful of thread blocks
    walking the cells (its float32 kernel took 31 us per layer of a SmolLM2 decode step over 256 cells on an H200,
    the three products below 18 us over 4,352); there matrix products over the cells, the query heads of each KV
    head grouped, keep the GPU busy, and ``mask`` is ``attention_bias``'s additive form. ``softcap`` (Gemma 2) caps
    the scaled scores at ``softcap * tanh(score / softcap)`` before the softmax."""
    n, heads, d = q.shape
    kv_heads = k.shape[0]
    if softcap and q.device.type != "cuda":
        group = heads // kv_heads
        scores = torch.einsum("nhd,hcd->hnc", q, k.repeat_interleave(group, 0)) * scale
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.einsum("hnc,hcd->nhd", torch.softmax(scores, -1), v.repeat_interleave(group, 0)).reshape(n, -1)
    if q.device.type != "cuda":
        att = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask, scale=scale,
                                             enable_gqa=heads != kv_heads)
        return att[0].transpose(0, 1).reshape(n, heads * d)
    group = heads // kv_heads
    qg = q.view(n, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, group * n, d)
    if softcap:
        scores = torch.tanh(torch.bmm(qg, k.transpose(1, 2)) * (scale / softcap)) * softcap
        scores = scores if mask is None else scores + mask
    elif mask is None:
        scores = torch.bmm(qg, k.transpose(1, 2)) * scale
    else:
        scores = torch.baddbmm(mask.expand(kv_heads, -1, -1), qg, k.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1)  # [kv_heads, group * n, cells]
    cells, rows = k.shape[1], group * n
    if cells % ATTN_CHUNK == 0 and cells > ATTN_CHUNK:
        # split the sum over cells into chunks, each its own matrix product (cuBLAS would give a product this
        # narrow one thread block per head, walking every cell), then add the chunks (64-cell chunks were slower
        # on an H200: the copy and the sum cost more than the shorter products saved)
        c = cells // ATTN_CHUNK
        p = probs.view(kv_heads, rows, c, ATTN_CHUNK).transpose(1, 2).reshape(kv_heads * c, rows, ATTN_CHUNK)
        out = torch.bmm(p, v.reshape(kv_heads * c, ATTN_CHUNK, d)).view(kv_heads, c, rows, d).sum(1)
    else:
        out = torch.bmm(probs, v)
    return out.view(kv_heads, group, n, d).permute(2, 0, 1, 3).reshape(n, heads * d)


def attention_bias(mask: torch.Tensor, group: int) -> torch.Tensor:
    """A boolean mask [n, cells] as ``attend``'s CUDA form: 0 / -inf [group * n, cells] (query-head major)."""
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias.repeat(group, 1)


def neox_to_pairs(head_dim: int) -> np.ndarray:
    """The permutation of a head's dimensions that turns NEOX RoPE pairs (i, i + d/2) into adjacent pairs."""
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=-1).reshape(-1)


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate x [n, heads, head_dim] whose RoPE pairs are adjacent dimensions (2i, 2i+1)."""
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rotation).flatten(-2)


class Transformer:
    """The weights and the forward step of one model."""

    def __init__(self, config: ModelConfig, loader: WeightLoader) -> None:
        self.config = c = config
        self.device = loader.device
        self.source = loader.gguf  # the memory-mapped file the weights are read from
        # the KV cache's key and value types (load_model's -ctk / -ctv); None: 16-bit under the compiled CPU engine,
        # as llama.cpp's default, float32 on the torch paths (the references) and on CUDA (whose 16-bit caches have
        # not run on a GPU)
        self.kv_types: tuple[torch.dtype, torch.dtype] | None = None
        emb = loader.gguf.info("token_embd.weight")
        if emb.shape != (c.n_vocab, c.n_embd):
            raise GGUFError(f"token_embd shape {emb.shape} does not match vocab {c.n_vocab} x {c.n_embd}")
        self.tok_embd = Embedding(loader.gguf, "token_embd.weight", self.device)
        # the output matrix, or the embedding's (tied) in its own form
        self.output = loader.linear("output.weight" if loader.has("output.weight") else "token_embd.weight")
        self.engine: Engine | None = None  # a compiled forward (cpu_engine) replacing the torch path below
        self.kernel = "torch-int4-f32" if loader.quantized else "torch-dense"
        self.output_norm = loader.tensor("output_norm.weight")
        # Keys and queries are kept with RoPE pairs adjacent (llama.cpp's "normal" layout); NEOX models get their
        # q/k rows (and q/k norm weights and biases) permuted at load, which leaves every attention score unchanged.
        perm = neox_to_pairs(c.head_dim) if c.rope_neox else None
        q_rows = None if perm is None else (np.arange(c.n_head)[:, None] * c.head_dim + perm).reshape(-1)
        k_rows = None if perm is None else (np.arange(c.n_head_kv)[:, None] * c.head_dim + perm).reshape(-1)
        qd, kd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim

        def optional(name: str, rows: np.ndarray | None = None) -> torch.Tensor | None:
            if not loader.has(name):
                return None
            w = loader.tensor(name)
            return w if rows is None else w[torch.from_numpy(rows)].contiguous()

        def shaped(lin: Linear, name: str, shape: tuple[int, int]) -> Linear:
            if lin.shape != shape:
                raise GGUFError(f"{loader.gguf.path}: {name} is {lin.shape[0]} x {lin.shape[1]}, expected "
                                f"{shape[0]} x {shape[1]}")
            return lin

        self.layers = []
        for i in range(c.n_layer):
            p = f"blk.{i}."
            if loader.has(p + "attn_qkv.weight"):  # Phi-3: one fused q|k|v matrix
                rows = None if perm is None else np.concatenate([q_rows, qd + k_rows, np.arange(qd + kd, qd + 2 * kd)])
                qkv = loader.linear(p + "attn_qkv.weight", rows)
            else:
                qkv = loader.linears([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                                     [q_rows, k_rows, None])
            biases = [optional(p + f"attn_{x}.bias", r) for x, r in (("q", q_rows), ("k", k_rows), ("v", None))]
            if any(b is not None for b in biases) and not all(b is not None for b in biases):
                raise GGUFError(f"{loader.gguf.path}: layer {i} has biases on only some of q, k, v")
            if loader.has(p + "ffn_gate.weight"):
                gate_up = loader.linears([p + "ffn_gate.weight", p + "ffn_up.weight"])
            else:  # Phi-3: gate and up fused in ffn_up, the gate first
                gate_up = loader.linear(p + "ffn_up.weight")
            for name in ("attn_output.bias", "ffn_down.bias", "ffn_up.bias", "attn_norm.bias"):
                if loader.has(p + name):
                    raise GGUFError(f"{loader.gguf.path}: tensor {p + name} is not supported")
            self.layers.append(Layer(
                attn_norm=loader.tensor(p + "attn_norm.weight"),
                qkv=shaped(qkv, p + "attn_q|k|v", (qd + 2 * kd, c.n_embd)),
                wo=shaped(loader.linear(p + "attn_output.weight"), p + "attn_output", (c.n_embd, qd)),
                ffn_norm=loader.tensor(p + "ffn_norm.weight"),
                gate_up=shaped(gate_up, p + "ffn_gate|up", (2 * c.n_ff, c.n_embd)),
                down=shaped(loader.linear(p + "ffn_down.weight"), p + "ffn_down", (c.n_embd, c.n_ff)),
                q_norm=optional(p + "attn_q_norm.weight", perm),
                k_norm=optional(p + "attn_k_norm.weight", perm),
                post_attn_norm=optional(p + "post_attention_norm.weight"),
                post_ffn_norm=optional(p + "post_ffw_norm.weight"),
                qkv_bias=torch.cat(biases) if biases[0] is not None else None,  # type: ignore[arg-type]
            ))

    def release_pages(self) -> None:
        """Drop the model file's pages from memory (packed engines hold their own copy; see GGUFFile)."""
        self.source.release_pages()

    def dense(self) -> Transformer:
        """A copy on the torch path with every linear dequantized (the reference path)."""
        return self._map_linears(Linear.dense, "torch-dense")

    def with_int4_dtype(self, dtype: torch.dtype) -> Transformer:
        """A copy on the torch path whose 4-bit linears run torch's int4 kernel with ``dtype`` activations."""
        name = {torch.float32: "torch-int4-f32", torch.bfloat16: "torch-int4-bf16"}.get(dtype, f"torch-int4-{dtype}")
        return self._map_linears(lambda lin: lin.with_int4_dtype(dtype), name)

    def with_engine(self, engine: Engine | None, kernel: str) -> Transformer:
        """This model's forward through ``engine`` (None: the torch path), named ``kernel`` in timings."""
        other = self._map_linears(lambda lin: lin, kernel)
        other.engine = engine
        return other

    def _map_linears(self, fn: Callable[[Linear], Linear], kernel: str) -> Transformer:
        other = object.__new__(Transformer)
        other.__dict__.update(self.__dict__)
        other.engine, other.kernel = None, kernel
        other.output = fn(self.output)
        other.layers = [Layer(**{k: (fn(v) if isinstance(v, Linear) else v) for k, v in vars(layer).items()})
                        for layer in self.layers]
        return other

    def new_cache(self, size: int, n_seq_max: int = 1, unified: bool = True) -> KVCache:
        c = self.config
        # CUDA graphs run fixed batch shapes: their padding rows write to a spare cell past the end, and the cells
        # are a whole number of attention chunks
        spare = (-size) % ATTN_CHUNK or ATTN_CHUNK if self.device.type == "cuda" else 0
        types = self.kv_types or ((torch.float16,) * 2 if self.engine is not None and self.device.type == "cpu"
                                  else (torch.float32,) * 2)
        return KVCache(c.n_layer, c.n_head_kv, c.head_dim, c.head_dim, size, n_seq_max, device=self.device,
                       spare=spare, unified=unified, dtype=types[0], dtype_v=types[1])

    def layer_rope(self, i: int, cache: KVCache) -> Rope:
        """Layer ``i``'s rotary embedding for a cache of this size (llama.cpp picks Phi-3's factors by context)."""
        return self.config.rope(i, cache.size // (1 if cache.unified else cache.n_seq_max))

    def layer_window(self, i: int) -> int | None:
        """The sliding window of layer ``i``, None for global attention."""
        return self.config.swa_window if i in self.config.swa_layers else None

    def apply_kv_shift(self, cache: KVCache) -> None:
        """Re-rotate stored keys by each cell's pending position shift (llama.cpp's K-shift)."""
        shift = cache.take_shift()
        if shift is None:
            return
        cells = torch.from_numpy(np.flatnonzero(shift)).to(self.device)
        if cells.numel() == 0:
            return
        delta = torch.from_numpy(shift).to(self.device)[cells]
        rotations: dict[Rope, torch.Tensor] = {}
        for i in range(self.config.n_layer):
            rope = self.layer_rope(i, cache)
            if rope not in rotations:  # a turn by delta: the keys already carry the rope's magnitude
                rotations[rope] = rope.rotation(delta, self.config.head_dim, magnitude=False)
            k = cache.k[i][:, cells].transpose(0, 1).float()  # [cells, heads, dim], rotated in float32
            cache.k[i][:, cells] = apply_rope(k, rotations[rope]).transpose(0, 1).to(cache.k.dtype)

    def prepare(self, cache: KVCache, positions: np.ndarray, seq_ids: list[tuple[int, ...]],
                ) -> tuple[np.ndarray, int, dict[int | None, np.ndarray]]:
        """Place a batch in the cache: pending K-shifts applied, cells found and occupied. Returns the cells, the
        number of cells to attend over, and the attention mask [n, n_kv] per sliding window (None: global)."""
        self.apply_kv_shift(cache)
        cells = cache.find_slot(len(positions), seq_ids)
        cache.occupy(cells, positions, seq_ids)
        n_kv = cache.n_attn
        first_seq = np.array([s[0] for s in seq_ids], dtype=np.int64)
        windows = {self.layer_window(i) for i in range(self.config.n_layer)}
        return cells, n_kv, {w: cache.mask(positions, first_seq, n_kv, w) for w in windows}

    @torch.inference_mode()
    def forward(self, cache: KVCache, tokens: np.ndarray, positions: np.ndarray, seq_ids: list[tuple[int, ...]],
                outputs: np.ndarray) -> torch.Tensor:
        """Logits [n_outputs, n_vocab] (float32) for the rows where ``outputs`` is true."""
        cells, n_kv, masks = self.prepare(cache, positions, seq_ids)
        rows = np.flatnonzero(outputs)
        engine = self.engine or self
        return engine.compute(self, cache, np.asarray(tokens, dtype=np.int64), positions, cells, n_kv, masks, rows)

    @torch.inference_mode()
    def embed(self, cache: KVCache, tokens: np.ndarray, positions: np.ndarray, seq_ids: list[tuple[int, ...]],
              ) -> torch.Tensor:
        """Every token's embedding [n, n_embd] (float32): the final norm's output, what the LM head reads (llama.cpp's
        ``t_embd``, which its pooling reads). The batch is placed in the cache as ``forward`` places it."""
        cells, n_kv, masks = self.prepare(cache, positions, seq_ids)
        engine = self.engine or self
        return engine.compute_embeddings(self, cache, np.asarray(tokens, dtype=np.int64), positions, cells, n_kv,
                                         masks)

    def compute(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        """The torch path of a prepared batch (``transformer`` is self: the ``Engine`` protocol)."""
        x = self._hidden_of(cache, tokens, positions, cells, n_kv, masks)
        if rows.size != len(tokens):
            x = x[torch.from_numpy(rows).to(self.device)]
        return self.logits(x)

    def compute_embeddings(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray,
                           positions: np.ndarray, cells: np.ndarray, n_kv: int,
                           masks: dict[int | None, np.ndarray]) -> torch.Tensor:
        """The torch path's embeddings of a prepared batch (the ``Engine`` protocol)."""
        return self.final_norm(self._hidden_of(cache, tokens, positions, cells, n_kv, masks))

    def _hidden_of(self, cache: KVCache, tokens: np.ndarray, positions: np.ndarray, cells: np.ndarray, n_kv: int,
                   masks: dict[int | None, np.ndarray]) -> torch.Tensor:
        """``hidden`` of a prepared batch given as host arrays."""
        n, dev = len(tokens), self.device
        contiguous = bool(cells[-1] - cells[0] == n - 1)
        where = slice(int(cells[0]), int(cells[0]) + n) if contiguous else torch.from_numpy(cells).to(dev)
        masks_t = {w: None if m.all() else torch.from_numpy(m).to(dev) for w, m in masks.items()}
        return self.hidden(cache, torch.from_numpy(tokens).to(dev), torch.from_numpy(positions).to(dev), where,
                           masks_t, n_kv)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden states through the output norm: the embeddings, the LM head's input."""
        return rms_norm(x, self.output_norm, self.config.rms_eps)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.softcap(self.output(self.final_norm(x)))

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's final soft-capping of the logits, in place (nothing for other models)."""
        cap = self.config.final_softcap
        if cap:
            logits.mul_(1.0 / cap).tanh_().mul_(cap)
        return logits

    def hidden(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, cells: slice | torch.Tensor,
               masks: dict[int | None, torch.Tensor | None], n_kv: int) -> torch.Tensor:
        """The last layer's hidden states of a batch whose keys/values go to ``cells``, attending over the first
        ``n_kv`` cells through ``masks`` (per sliding window; None: everything). Only tensor operations on the
        model's device: the CUDA engine captures this as a graph."""
        c = self.config
        n = tokens.shape[0]
        layer_ropes = [self.layer_rope(i, cache) for i in range(c.n_layer)]
        ropes = {r: r.rotation(positions, c.head_dim) for r in set(layer_ropes)}
        x = self.tok_embd(tokens)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        qd, kd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        if self.device.type == "cuda":
            masks = {w: None if m is None else attention_bias(m, c.n_head // c.n_head_kv) for w, m in masks.items()}
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_eps)
            qkv = layer.qkv(h)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            rotation = ropes[layer_ropes[i]]
            if layer.q_norm is None:  # queries and keys rotated in one operation
                qk = apply_rope(qkv[:, :qd + kd].view(n, c.n_head + c.n_head_kv, c.head_dim), rotation)
                q, k = qk[:, :c.n_head], qk[:, c.n_head:]
            else:
                q = rms_norm(qkv[:, :qd].view(n, c.n_head, c.head_dim), layer.q_norm, c.rms_eps)
                k = rms_norm(qkv[:, qd:qd + kd].view(n, c.n_head_kv, c.head_dim), layer.k_norm, c.rms_eps)
                q, k = apply_rope(q, rotation), apply_rope(k, rotation)
            v = qkv[:, qd + kd:]
            cache.k[i][:, cells] = k.transpose(0, 1)
            cache.v[i][:, cells] = v.view(n, c.n_head_kv, c.head_dim).transpose(0, 1)
            att = layer.wo(attend(q, cache.k[i][:, :n_kv].to(q.dtype), cache.v[i][:, :n_kv].to(q.dtype),
                                  masks[self.layer_window(i)], c.attn_scale, c.attn_softcap))
            if layer.post_attn_norm is not None:
                att = rms_norm(att, layer.post_attn_norm, c.rms_eps)
            x = x + att
            h = rms_norm(x, layer.ffn_norm, c.rms_eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            act = F.gelu(gate, approximate="tanh") if c.gelu else F.silu(gate)
            ffn = layer.down(act * up)
            if layer.post_ffn_norm is not None:
                ffn = rms_norm(ffn, layer.post_ffn_norm, c.rms_eps)
            x = x + ffn
        return x
