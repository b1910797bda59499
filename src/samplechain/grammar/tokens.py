"""A vocabulary's token texts as the grammar engine reads them: built once per vocabulary, shared by the
masks of every grammar."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from samplechain.grammar.utf8 import INVALID, decode, partial_range


class TokenTable:
    """A vocabulary's token texts as code points, for masks: ragged code points, lengths, trailing partials.

    ``pieces`` is each token's text as the grammar sees it. Control tokens (special, not end-of-generation) have
    none: only token items (``<[id]>``, ``<|name|>``, ``!<[id]>``) match them, never literals or character
    classes. (llama.cpp matches their rendered text, so ``<|im_start|>`` fits inside a JSON string: a bug we do not
    copy.) End-of-generation tokens keep their text but are never matched by text or by a token item: the sampler
    allows them exactly where the grammar can end (an empty stack), as llama.cpp's ``llama_grammar_apply_impl``
    and ``llama_grammar_accept_impl`` do (src/llama-grammar.cpp).

    Usable tokens with at least one code point are also kept ordered by their first code point, so the first
    column of a mask is decided once per distinct first character instead of once per token.
    """

    def __init__(self, pieces: list[bytes], eog: Iterable[int], control: Iterable[int] = ()) -> None:
        n = len(pieces)
        eog_set = {t for t in eog if 0 <= t < n}
        control_set = {t for t in control if 0 <= t < n} - eog_set
        pieces = [b"" if i in control_set else bytes(p) for i, p in enumerate(pieces)]
        lens = np.zeros(n, dtype=np.int64)
        offsets = np.zeros(n, dtype=np.int64)
        partial_value = np.zeros(n, dtype=np.int64)
        partial_n = np.zeros(n, dtype=np.int64)
        usable = np.zeros(n, dtype=bool)
        cont_start: list[int] = []
        flat: list[int] = []
        for i, p in enumerate(pieces):
            nul = p.find(0)
            if nul >= 0:
                p = p[:nul]
            if not p or i in eog_set:
                continue
            if 0x80 <= p[0] < 0xC0:
                cont_start.append(i)
            cps, partial = decode(p)
            if partial == INVALID:
                continue
            usable[i] = True
            offsets[i] = len(flat)
            lens[i] = len(cps)
            flat.extend(cps)
            partial_value[i], partial_n[i] = partial
        self.pieces = pieces
        self.n = n
        self.eog = np.array(sorted(eog_set), dtype=np.int64)
        self.control = np.array(sorted(control_set), dtype=np.int64)  # no text: matched by token items only
        self.usable = usable  # text a character set can consume: non-empty, valid UTF-8 (partial at the end)
        self.usable_ids = np.flatnonzero(usable)
        self.by_id = np.ones(n, dtype=bool)  # what a token element can match: any id but end-of-generation
        self.by_id[self.eog] = False
        self.flat = np.array([*flat, 0], dtype=np.int64)
        self.lut_size = int(self.flat.max()) + 1  # lookup tables cover every code point the vocabulary has
        self.offsets = offsets
        self.lens = lens
        self.partial_value = partial_value
        self.partial_n = partial_n
        self.cont_start = cont_start
        with_cps = self.usable_ids[lens[self.usable_ids] > 0]
        first = self.flat[offsets[with_cps]]
        order = np.argsort(first, kind="stable")
        self.first_ids = with_cps[order]
        self.first_cps, self.first_counts = np.unique(first[order], return_counts=True)
        self.partial_only = self.usable_ids[lens[self.usable_ids] == 0]
        # the code points a token's trailing partial sequence can complete to (-1: none)
        self.partial_low = np.full(n, -1, dtype=np.int64)
        self.partial_high = np.full(n, -1, dtype=np.int64)
        for i in np.flatnonzero(partial_n > 0).tolist():
            rng = partial_range((int(partial_value[i]), int(partial_n[i])))
            if rng is not None:
                self.partial_low[i], self.partial_high[i] = rng

    @classmethod
    def of(cls, vocab: object) -> TokenTable:
        """The table of a :class:`~samplechain.Vocab` (built once per vocabulary)."""
        table = getattr(vocab, "_grammar_tokens", None)
        if table is None:
            table = cls([vocab.token_bytes(i) for i in range(vocab.n_tokens)], vocab.eog, vocab.control)
            vocab._grammar_tokens = table
        return table
