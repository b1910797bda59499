"""``Sequence``: one sequence of a context's cache, the tokens in its cells, and every change made to them.

Prefix reuse (a prompt cache, a server slot's last prompt, a trace, a draft model following its target),
truncation (rejected drafts, a rewound stop), appends, and llama.cpp's context shift all go through here, so
the token list and the cells can never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from samplechain.runtime.state import StateError

if TYPE_CHECKING:
    import torch

    from samplechain.runtime.context import Context


class Sequence:
    """Sequence ``seq_id`` of ``ctx``: ``tokens`` holds what its cells hold, position by position.

    ``n_ctx`` is how many cells the sequence may use: the whole context, or a server slot's stream of it."""

    def __init__(self, ctx: Context, seq_id: int = 0, n_ctx: int | None = None) -> None:
        self.ctx, self.id = ctx, seq_id
        self.n_ctx = n_ctx or ctx.n_ctx
        self.tokens: list[int] = []

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def has_room(self, n: int = 1) -> bool:
        """Whether ``n`` more tokens fit while one cell stays free (llama.cpp's ``n_past + 1 < n_ctx``)."""
        return self.n_past + n < self.n_ctx

    # --- reading what is cached -----------------------------------------------------------------------

    def common_prefix(self, tokens: Iterable[int]) -> int:
        """How many leading ``tokens`` the cells already hold."""
        return common_prefix(self.tokens, list(tokens))

    def reuse(self, tokens: list[int], n_fresh: int = 1) -> int:
        """Keep the cells ``tokens`` shares with what is cached, drop the rest; at least ``n_fresh`` of ``tokens``
        stay to be decoded (1: the last token is decoded again, for its logits). Returns how many are kept."""
        n_keep = max(min(self.common_prefix(tokens), len(tokens) - n_fresh), 0)
        self.truncate(n_keep)
        return n_keep

    def load_state(self, path: str | os.PathLike[str]) -> None:
        """The context's state file (a prompt cache) as this sequence's cells; ``tokens`` as far as cells exist."""
        try:
            saved = self.ctx.load_state(path)
        except StateError as e:
            raise StateError(f"prompt cache: {e}") from e
        self.tokens = saved[:max(self.ctx.seq_pos_max(self.id) + 1, 0)]

    def save_state(self, path: str | os.PathLike[str], tokens: list[int]) -> int:
        return self.ctx.save_state(path, tokens)

    # --- changing the cells ---------------------------------------------------------------------------

    def clear(self) -> None:
        """No cells (the whole context's when it holds this sequence only)."""
        if self.ctx.kv.n_seq_max == 1:
            self.ctx.clear()
        else:
            self.ctx.seq_rm(self.id, -1, -1)
        self.tokens = []

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions."""
        if n < len(self.tokens):
            self.ctx.seq_rm(self.id, n, -1)
        del self.tokens[n:]

    def positions(self, n: int) -> range:
        """The positions of the next ``n`` tokens."""
        return range(self.n_past, self.n_past + n)

    def appended(self, tokens: Iterable[int]) -> None:
        """``tokens`` were decoded at ``positions(len(tokens))`` (in a batch the caller assembled)."""
        self.tokens += tokens

    def decode(self, tokens: list[int], outputs: list[bool] | None = None) -> torch.Tensor:
        """Decode ``tokens`` after the cached ones; logits for ``outputs`` (default: the last token only)."""
        rows = self.ctx.decode(tokens, positions=self.positions(len(tokens)), seq_ids=[self.id] * len(tokens),
                               outputs=outputs)
        self.tokens += tokens
        return rows

    def shift(self, n_keep: int, n_discard: int = 0) -> bool:
        """llama.cpp's context shift: keep the first ``n_keep`` positions, drop the next ``n_discard`` (0: half of
        the rest) and slide the remainder back. False (nothing changed) when nothing can be dropped."""
        n_left = self.n_past - n_keep
        n_discard = min(n_discard, n_left) if n_discard > 0 else n_left // 2
        if n_keep < 0 or n_discard <= 0:
            return False
        self.ctx.context_shift(self.n_past, n_keep, self.id, n_discard)
        del self.tokens[n_keep:n_keep + n_discard]
        return True


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
