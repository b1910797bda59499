"""A context: one KV cache and the decode step over it (llama.cpp's ``llama_context``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from samplechain.runtime.kv_cache import KVCacheFull
from samplechain.runtime.state import load_state, save_state

if TYPE_CHECKING:
    from samplechain.runtime.model import Transformer


class Context:
    """Decodes batches of tokens for up to ``n_seq_max`` sequences sharing one cache of ``n_ctx`` cells."""

    def __init__(self, transformer: Transformer, n_ctx: int = 4096, n_seq_max: int = 1, n_batch: int = 512,
                 kv_unified: bool = True) -> None:
        if n_ctx < 8:
            raise ValueError(f"n_ctx must be at least 8, got {n_ctx}")
        if n_batch < 1:
            raise ValueError(f"n_batch must be positive, got {n_batch}")
        self.transformer = transformer
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.kv = transformer.new_cache(n_ctx, n_seq_max, kv_unified)

    @property
    def n_vocab(self) -> int:
        return self.transformer.config.n_vocab

    def decode(self, tokens: Sequence[int], positions: Sequence[int] | None = None,
               seq_ids: Sequence[int | Sequence[int]] | None = None,
               outputs: Sequence[bool] | None = None) -> torch.Tensor:
        """Evaluate a batch; returns logits [n_outputs, n_vocab] for the rows marked as outputs.

        Defaults as ``llama_batch_get_one``: one sequence (0), positions continuing after its last one, and an
        output for the last token only. Larger batches are split into ``n_batch`` pieces.
        """
        toks, pos, seqs, out = self._batch(tokens, positions, seq_ids, outputs)
        n = toks.size
        results = []
        for i in range(0, n, self.n_batch):
            j = min(n, i + self.n_batch)
            logits = self.transformer.forward(self.kv, toks[i:j], pos[i:j], seqs[i:j], out[i:j])
            if out[i:j].any():
                results.append(logits)
        if not results:
            return torch.empty(0, self.n_vocab)
        return results[0] if len(results) == 1 else torch.cat(results)

    def embed(self, tokens: Sequence[int], positions: Sequence[int] | None = None,
              seq_ids: Sequence[int | Sequence[int]] | None = None) -> torch.Tensor:
        """Evaluate a batch as ``decode`` does; returns every token's embedding [n, n_embd] (the final norm's
        output, llama.cpp's embeddings before pooling) instead of logits."""
        toks, pos, seqs, _ = self._batch(tokens, positions, seq_ids, None)
        n = toks.size
        parts = [self.transformer.embed(self.kv, toks[i:i + self.n_batch], pos[i:i + self.n_batch],
                                        seqs[i:i + self.n_batch]) for i in range(0, n, self.n_batch)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _batch(self, tokens: Sequence[int], positions: Sequence[int] | None,
               seq_ids: Sequence[int | Sequence[int]] | None, outputs: Sequence[bool] | None,
               ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, ...]], np.ndarray]:
        """A batch checked and completed with the defaults (see ``decode``), its cells known to fit."""
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = toks.size
        if n == 0:
            raise ValueError("decode needs at least one token")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            bad = int(toks[(toks < 0) | (toks >= self.n_vocab)][0])
            raise ValueError(f"token id {bad} is not in [0, {self.n_vocab})")
        seqs = [(0,)] * n if seq_ids is None else [tuple(s) if isinstance(s, Sequence) else (int(s),) for s in seq_ids]
        if len(seqs) != n or any(not s for s in seqs):
            raise ValueError("seq_ids needs one non-empty entry per token")
        for s in seqs:
            for sid in s:
                self.kv.check_seq(sid)
        if positions is None:
            start = self.kv.seq_pos_max(seqs[0][0]) + 1
            pos = np.arange(start, start + n, dtype=np.int64)
        else:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            if pos.size != n or (pos < 0).any():
                raise ValueError("positions needs one non-negative position per token")
        out = np.zeros(n, dtype=bool)
        if outputs is None:
            out[-1] = True
        else:
            out[:] = np.asarray(outputs, dtype=bool).reshape(-1)
        if self.kv.unified and n > self.kv.size - self.kv.n_used:
            raise KVCacheFull(f"KV cache full: {n} tokens need cells, {self.kv.size - self.kv.n_used} of "
                              f"{self.kv.size} are free (context shift is off or not enough)")
        return toks, pos, seqs, out

    def context_shift(self, n_past: int, n_keep: int, seq: int = 0, n_discard: int = 0) -> int:
        """llama.cpp's context shift on the cells: keep the first ``n_keep`` positions, drop the next ``n_discard``
        (0: half of the rest), slide the remainder back (keys are re-rotated at the next decode). Returns the new
        ``n_past``. ``Sequence.shift`` keeps a sequence's tokens in step with it."""
        n_discard = n_discard or (n_past - n_keep) // 2
        if n_keep < 0 or n_discard <= 0:
            raise ValueError(f"cannot shift a context of {n_past} tokens keeping {n_keep}: nothing to discard")
        self.kv.seq_rm(seq, n_keep, n_keep + n_discard)
        self.kv.seq_add(seq, n_keep + n_discard, n_past, -n_discard)
        return n_past - n_discard

    # llama_memory_* on this context's cache
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return self.kv.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.kv.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self.kv.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.kv.seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self.kv.seq_div(seq, p0, p1, d)

    def seq_pos_max(self, seq: int) -> int:
        return self.kv.seq_pos_max(seq)

    def clear(self) -> None:
        self.kv.clear()

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int]) -> int:
        return save_state(path, self.transformer, self.kv, list(tokens))

    def load_state(self, path: str | os.PathLike[str]) -> list[int]:
        return load_state(path, self.transformer, self.kv)

