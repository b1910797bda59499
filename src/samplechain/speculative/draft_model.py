"""draft-simple: a second, smaller or faster model drafts for the target (llama.cpp's
``common_speculative_impl_draft_simple``, common/speculative.cpp).

Its KV cache follows the target's history: before each draft the common prefix is kept and the rest re-decoded,
which also removes the draft's own rejected tokens. Drafting as llama.cpp does it: greedy top-1 among the top 10
(probabilities renormalised over those 10), stopping below ``p_min``, at ``n_max`` tokens; drafts shorter than
``n_min`` are dropped. With ``sample=True`` the draft instead samples from its distribution and keeps it, for
distribution-preserving verification (``verify.speculative_sample``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from samplechain.runtime.context import Context
from samplechain.runtime.generation import Model
from samplechain.runtime.sequence import Sequence as CacheSequence
from samplechain.vocab import Vocab

TOP_K = 10


def check_compatible(target: Vocab, draft: Vocab) -> None:
    """llama.cpp's vocabulary checks for a draft model (``common_speculative_are_compatible``); ValueError naming
    the first difference."""
    t_kind = getattr(target.tokenizer, "model", None)
    d_kind = getattr(draft.tokenizer, "model", None)
    if t_kind != d_kind:
        raise ValueError(f"draft model vocabulary type {d_kind!r} differs from the target's {t_kind!r}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        raise ValueError("draft model BOS token or add-BOS flag differs from the target's")
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        raise ValueError("draft model EOS token or add-EOS flag differs from the target's")
    if abs(target.n_tokens - draft.n_tokens) > 128:
        raise ValueError(f"draft model vocabulary has {draft.n_tokens} tokens, the target {target.n_tokens} "
                         "(at most 128 apart)")
    for i in range(5, min(target.n_tokens, draft.n_tokens)):
        if target.token_bytes(i) != draft.token_bytes(i):
            raise ValueError(f"draft model token {i} is {draft.token_bytes(i)!r}, the target's "
                             f"{target.token_bytes(i)!r}")


class DraftModel:
    """A draft model as a drafter (``name`` "draft-simple")."""

    name = "draft-simple"

    def __init__(self, draft: Model, target_vocab: Vocab | None = None, *, n_max: int = 16, n_min: int = 0,
                 p_min: float = 0.0, n_ctx: int = 4096, sample: bool = False, seed: int = 0,
                 seq: CacheSequence | None = None) -> None:
        """``seq``: a sequence of a draft context to draft in (a server slot's); None: a context of ``n_ctx``
        cells of its own."""
        if n_max < 1 or n_min < 0 or n_min > n_max:
            raise ValueError(f"draft lengths: need 1 <= n_max and 0 <= n_min <= n_max, got {n_max}, {n_min}")
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        if target_vocab is not None:
            check_compatible(target_vocab, draft.vocab)
        self.model, self.n_max, self.n_min, self.p_min = draft, n_max, n_min, p_min
        if seq is None:
            seq = CacheSequence(draft.new_context(n_ctx))
        self.seq = seq  # what the draft cache holds
        self.ctx: Context = seq.ctx
        self.sample, self.seed = sample, seed
        self.rng = np.random.default_rng(seed)
        self.distributions: list[tuple[np.ndarray, np.ndarray]] = []  # per drafted token: (ids, probs)

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation: the cache keeps what it shares with ``prompt``, and the draws start from the seed
        again (a server slot's drafter serves one task after another)."""
        self.rng = np.random.default_rng(self.seed)
        self._sync(list(prompt))

    def _sync(self, history: list[int]) -> None:
        rest = history[self.seq.reuse(history, n_fresh=0):]
        if rest:
            self.seq.decode(rest, outputs=[False] * len(rest))

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        self.distributions = []
        if len(history) + self.n_max + 2 > self.seq.n_ctx:
            return []
        self._sync(list(history))
        out: list[int] = []
        token = id_last
        while len(out) < self.n_max:
            logits = self.seq.decode([token])[-1].cpu().numpy().astype(np.float64)
            top = np.argpartition(-logits, TOP_K)[:TOP_K]
            top = top[np.lexsort((top, -logits[top]))]  # descending logit, ties by id
            p = np.exp(logits[top] - logits[top[0]])
            p /= p.sum()
            i = int(self.rng.choice(TOP_K, p=p)) if self.sample else 0
            if p[i] < self.p_min:
                break
            token = int(top[i])
            out.append(token)
            self.distributions.append((top.copy(), p))
        if len(out) < self.n_min:
            return []
        return out

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        """Nothing to do: the next draft re-synchronises the cache with the target's history."""
