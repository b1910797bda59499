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

    Usable tokens with at least one code point are also laid out as a prefix tree (:class:`TokenTrie`), so a
    mask walks each distinct prefix once instead of each token.
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
        self.partial_only = self.usable_ids[lens[self.usable_ids] == 0]
        # the code points a token's trailing partial sequence can complete to (-1: none)
        self.partial_low = np.full(n, -1, dtype=np.int64)
        self.partial_high = np.full(n, -1, dtype=np.int64)
        for i in np.flatnonzero(partial_n > 0).tolist():
            rng = partial_range((int(partial_value[i]), int(partial_n[i])))
            if rng is not None:
                self.partial_low[i], self.partial_high[i] = rng
        self.partial_only_range = (self.partial_low[self.partial_only], self.partial_high[self.partial_only])
        self.trie = TokenTrie(self)

    @classmethod
    def of(cls, vocab: object) -> TokenTable:
        """The table of a :class:`~samplechain.Vocab` (built once per vocabulary)."""
        table = getattr(vocab, "grammar_tokens", None)
        if table is None:
            table = cls([vocab.token_bytes(i) for i in range(vocab.n_tokens)], vocab.eog, vocab.control)
            vocab.grammar_tokens = table
        return table


class TokenTrie:
    """The usable tokens with at least one code point as a prefix tree over their code points.

    Tokens are sorted by their code points (a token before its extensions; at equal code points, one without a
    trailing partial UTF-8 sequence first), so every tree node (a distinct prefix) owns a contiguous range of
    *positions* ``[lo, hi)`` in that order: first the tokens that end at the node without a partial sequence
    ``[lo, end)``, then those that end there with one ``[end, pend)``, then the longer ones ``[pend, hi)``.
    Nodes are numbered depth by depth (``dstart[d]`` is the first node of depth ``d``, the prefixes of ``d + 1``
    code points) and, within a depth, in position order; a node's children are the nodes ``[clo, chi)``. Nodes are
    also listed by code point and then position (``by_cp``, with ``ucp`` the distinct code points and ``ucp_start``
    their offsets), for the walk that skips over a loop of the grammar (``mask_walk.py``); ``cpi`` is each node's index
    into ``ucp``, so that a character set is a lookup table over the vocabulary's distinct code points; ``cp_nodes``
    lists the nodes by code point and then number, for the children with given code points (a literal's next one).
    """

    def __init__(self, table: TokenTable) -> None:
        ids = table.usable_ids[table.lens[table.usable_ids] > 0]
        flat, offsets, lens = table.flat, table.offsets, table.lens
        pn = table.partial_n
        ids = np.concatenate([ids[pn[ids] == 0], ids[pn[ids] > 0]])  # a stable sort keeps this order at ties
        m = len(ids)
        self.m = m
        self.sorted_ids = ids[np.array(sorted(range(m), key=_texts(table, ids).__getitem__), dtype=np.int64)]
        self.pos_of = np.full(table.n, m, dtype=np.int64)  # a token's position; m: not in the tree
        self.pos_of[self.sorted_ids] = np.arange(m)
        self.in_tree = self.pos_of < m  # by token id
        slen = lens[self.sorted_ids]
        soff = offsets[self.sorted_ids]
        pflag = pn[self.sorted_ids] > 0
        # the longest common prefix of each token with the one before it, one depth at a time
        lcp = np.zeros(m, dtype=np.int64)
        live = np.arange(1, m)
        d = 0
        while len(live):
            live = live[(slen[live] > d) & (slen[live - 1] > d)]
            live = live[flat[soff[live] + d] == flat[soff[live - 1] + d]]
            lcp[live] = d + 1
            d += 1
        max_len = int(slen.max()) if m else 0
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        for d in range(max_len):
            boundary = np.flatnonzero(lcp <= d)  # a new prefix of d + 1 code points (or a shorter token) starts
            first = boundary[slen[boundary] > d]
            starts.append(first)
            ends.append(np.append(boundary, m)[np.searchsorted(boundary, first, side="right")])
        self.dstart = np.zeros(max_len + 1, dtype=np.int64)
        self.dstart[1:] = np.cumsum([len(s) for s in starts])
        total = int(self.dstart[-1])
        self.lo = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        self.hi = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
        self.depth = np.repeat(np.arange(max_len), np.diff(self.dstart))
        self.cp = flat[soff[self.lo] + self.depth] if total else np.zeros(0, dtype=np.int64)
        self.clo = np.zeros(total, dtype=np.int64)
        self.chi = np.zeros(total, dtype=np.int64)
        deeper = np.copy(self.hi)  # where the tokens longer than the node start
        for d in range(max_len - 1):
            a, b = self.dstart[d], self.dstart[d + 1]
            below = starts[d + 1]
            self.clo[a:b] = np.searchsorted(below, self.lo[a:b]) + b
            self.chi[a:b] = np.searchsorted(below, self.hi[a:b]) + b
            has = self.chi[a:b] > self.clo[a:b]
            deeper[a:b][has] = self.lo[self.clo[a:b][has]]
        if max_len:
            self.clo[self.dstart[-2]:] = self.chi[self.dstart[-2]:] = total
        partial_before = np.concatenate([[0], np.cumsum(pflag)])
        self.end = deeper - (partial_before[deeper] - partial_before[self.lo])
        self.pend = deeper
        self.partial_end = self.pend > self.end  # some token ends at the node inside a character
        self.below = self.hi - self.pend  # tokens longer than the node
        # trailing partial sequences by position, and the positions that have one
        self.plow = table.partial_low[self.sorted_ids]
        self.phigh = table.partial_high[self.sorted_ids]
        self.ptail = np.flatnonzero(pflag)
        self.by_cp = np.lexsort((self.depth, self.lo, self.cp))  # by code point, then (position, depth)
        self.by_cp_key = (self.lo * len(self.dstart) + self.depth)[self.by_cp]  # (position, depth) as one key
        self.ucp, first = np.unique(self.cp[self.by_cp], return_index=True)
        self.ucp_start = np.append(first, total)
        self.cpi = np.zeros(total, dtype=np.int64)  # each node's code point as an index into ucp
        self.cpi[self.by_cp] = np.repeat(np.arange(len(self.ucp)), np.diff(self.ucp_start))
        # nodes by code point and then number (depth, then position): a node's children with one code point are
        # found by bisection in that code point's run, ucp_start[i]:ucp_start[i + 1], between clo and chi
        self.cp_nodes = np.argsort(self.cpi, kind="stable")
        self.root_cps = self.cp[: self.dstart[1]] if max_len else np.zeros(0, dtype=np.int64)
        # the same arrays as the rows of one table, so that one column reads a node at once (small walks)
        self.node_rows = np.stack([self.cpi, self.lo, self.end, self.pend, self.hi, self.clo, self.chi])
        self.cpi, self.lo, self.end, self.pend, self.hi, self.clo, self.chi = self.node_rows


def _texts(table: TokenTable, ids: np.ndarray) -> list:
    """Each token's code points as a string (which sorts by code point), or as a list where some code point is
    beyond Unicode (an unchecked continuation byte can make one)."""
    flat = table.flat
    if table.lut_size > 0x110000:
        return [flat[o : o + k].tolist() for o, k in zip(table.offsets[ids].tolist(), table.lens[ids].tolist(),
                                                         strict=True)]
    out = []
    for i, o, k in zip(ids.tolist(), table.offsets[ids].tolist(), table.lens[ids].tolist(), strict=True):
        text = None
        if not table.partial_n[i]:
            try:  # as decode(): valid UTF-8 decodes to the same code points
                text = table.pieces[i].split(b"\0", 1)[0].decode("utf-8")
            except UnicodeDecodeError:
                pass
        out.append(text if text is not None else "".join(map(chr, flat[o : o + k].tolist())))
    return out
