"""The decode step on CUDA as replayed CUDA graphs over a static KV cache (gpt-fast's approach).

A 135M model's decode step is hundreds of tiny kernels: launched one by one from Python it is bound by launch
latency, not by the GPU. Here each batch-size bucket (1, 2, 4, ... ``max_batch``) and span of cells (the first
256, 1024, 4096, ... cells of the cache, the smallest that holds every cell in use: as llama.cpp attends over the
used cells padded to 256, not the whole cache) is captured once per KV cache as one graph: static input buffers
(tokens, positions, cells, attention masks over the span), the same ``Transformer.hidden`` as the eager path,
attention over the span with masked cells. A step copies its inputs into the graph's buffers and replays it.
Padding rows write their keys/values to the cache's last spare cell (past every span but the last) and attend only
to cell 0. Larger batches (prompts) run eagerly: they are bound by arithmetic, not launches.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from samplechain.runtime.kv_cache import KVCache
from samplechain.runtime.model import ATTN_CHUNK, Transformer

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def span_of(n_kv: int, cells_total: int) -> int:
    """The cells a graph attends over for ``n_kv`` cells in use: ATTN_CHUNK * 4^j, the smallest that holds them, or
    the whole cache (a multiple of ATTN_CHUNK, the spare cell last)."""
    span = ATTN_CHUNK
    while span < n_kv and span < cells_total:
        span *= 4
    return min(span, cells_total)


class _Graph:
    """One captured step for batches of up to ``size`` tokens on one cache, attending over its first ``span``
    cells."""

    def __init__(self, t: Transformer, cache: KVCache, size: int, span: int, pool: object, tf32: bool) -> None:
        dev = t.device
        self.size, self.span, self.spare = size, span, cache.k.shape[2] - 1
        self.ints = torch.zeros(3, size, dtype=torch.int64, device=dev)  # tokens, positions, cells: one copy
        self.tokens, self.positions, self.cells = self.ints[0], self.ints[1], self.ints[2]
        self.cells.fill_(self.spare)
        windows = {t.layer_window(i) for i in range(t.config.n_layer)}
        self.masks = {w: torch.zeros(size, span, dtype=torch.bool, device=dev) for w in windows}
        self.host_masks = {w: torch.zeros(size, span, dtype=torch.bool).pin_memory() for w in windows}
        self.host_ints = torch.zeros(3, size, dtype=torch.int64).pin_memory()
        for m in self.masks.values():
            m[:, 0] = True
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        # cuBLAS picks its kernels at capture: with ``tf32`` the graph keeps TF32 matrix kernels (the process-wide
        # setting is restored right after)
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):  # warm-up outside the graph (allocator, cuBLAS handles)
                    self._step(t, cache)
            torch.cuda.current_stream(dev).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool), torch.inference_mode():
                self.logits = self._step(t, cache)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved

    def _step(self, t: Transformer, cache: KVCache) -> torch.Tensor:
        x = t.hidden(cache, self.tokens, self.positions, self.cells, self.masks, self.span)
        return t.logits(x)

    def run(self, tokens: np.ndarray, positions: np.ndarray, cells: np.ndarray, n_kv: int,
            masks: dict[int | None, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        n = len(tokens)
        torch.cuda.current_stream(self.tokens.device).synchronize()  # the previous step has read the host buffers
        ints = self.host_ints.numpy()
        ints[0, :n], ints[1, :n], ints[2, :n] = tokens, positions, cells
        ints[:, n:] = 0
        ints[2, n:] = self.spare
        for w, host in self.host_masks.items():
            h = host.numpy()
            h[:] = False
            h[:n, :n_kv] = masks[w]
            h[n:, 0] = True
            self.masks[w].copy_(host, non_blocking=True)
        self.ints.copy_(self.host_ints, non_blocking=True)
        self.graph.replay()
        if rows.size == n and rows[-1] == n - 1:  # every row: a copy, since the next replay overwrites the buffer
            return self.logits[:n].clone()
        return self.logits[torch.from_numpy(rows).to(self.logits.device)]


class CudaGraphEngine:
    """Replays one captured graph per (KV cache, batch bucket); batches above ``max_batch`` run eagerly. With
    ``tf32`` the graphs' matrix products use TF32 tensor cores (about 1e-3 relative error, inside the accuracy
    bound); without, full float32."""

    def __init__(self, max_batch: int = 64, tf32: bool = False) -> None:
        self.tf32 = tf32
        self.buckets = tuple(b for b in BUCKETS if b <= max_batch)
        self._graphs: weakref.WeakKeyDictionary[KVCache, dict[tuple[int, int], _Graph]] = weakref.WeakKeyDictionary()

    def compute(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray, positions: np.ndarray,
                cells: np.ndarray, n_kv: int, masks: dict[int | None, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        n = len(tokens)
        if n > self.buckets[-1] or cache.k.shape[2] <= cache.size:
            return transformer.compute(transformer, cache, tokens, positions, cells, n_kv, masks, rows)
        key = next(b for b in self.buckets if b >= n), span_of(n_kv, cache.k.shape[2])
        graphs = self._graphs.setdefault(cache, {})
        if key not in graphs:  # one memory pool per cache: its graphs never run at the same time
            pool = next(iter(graphs.values())).graph.pool() if graphs else None
            graphs[key] = _Graph(transformer, cache, *key, pool, self.tf32)
        return graphs[key].run(tokens, positions, cells, n_kv, masks, rows)  # a gather: a tensor of its own

    def compute_embeddings(self, transformer: Transformer, cache: KVCache, tokens: np.ndarray,
                           positions: np.ndarray, cells: np.ndarray, n_kv: int,
                           masks: dict[int | None, np.ndarray]) -> torch.Tensor:
        """Embeddings run eagerly: they read whole prompts, bound by arithmetic, not launches."""
        return transformer.compute_embeddings(transformer, cache, tokens, positions, cells, n_kv, masks)
