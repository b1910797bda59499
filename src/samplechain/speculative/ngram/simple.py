"""ngram-simple (llama.cpp's ``common_speculative_impl_ngram_simple``): prompt-lookup drafting from the most recent
occurrence of the last N tokens; stateless."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from samplechain.speculative.ngram.common import match_positions, token_array
from samplechain.validate import check_int_range


class NgramSimple:
    """ngram-simple: the N tokens ending in ``id_last`` are looked up in the history, most recent occurrence
    first (position 0 never), and up to M tokens that followed it are the draft. Stateless."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        self.size_n = check_int_range("size_n", size_n, 1, 1024, "--spec-ngram-simple-size-n")
        self.size_m = check_int_range("size_m", size_m, 1, 1024, "--spec-ngram-simple-size-m")
        self.n_max = self.size_m

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        n, m = self.size_n, self.size_m
        length = len(history)
        if length <= n + m + 1:
            return []
        h = token_array(history)
        key = np.empty(n, dtype=np.int64)
        key[: n - 1] = h[length - n + 1 :]
        key[n - 1] = id_last
        found = match_positions(h, key, 1, length - n - 1)  # start positions L-N-1 down to 1
        if not found.size:
            return []
        j = int(found[-1])
        c = min(m, length - (j + n))
        if c < n:
            return []
        return h[j + n : j + n + c].tolist()

    def accept(self, n_accepted: int, is_other: bool = False) -> None:
        pass
