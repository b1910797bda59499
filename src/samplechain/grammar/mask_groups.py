"""The stack sets (groups) that the walk behind token masks (``mask_walk.py``) meets, interned with their successors
by code point, and the grammar's character sets over the vocabulary's prefix tree (``tokens.TokenTrie``): each set's
lookup table over the tree's distinct code points, its first nodes, the tokens whose partial character it can
complete, and for a group that maps itself to itself on most code points (a string's contents), the nodes that leave
that loop.

Everything here depends on the grammar and the vocabulary only, not on the state being masked: it is built once per
``MaskEngine`` (the character sets' tables with the grammar, as part of its compile time) and shared by every walk.
"""

from __future__ import annotations

import numpy as np

from samplechain.grammar.engine import CHARSET, Grammar, Stack
from samplechain.grammar.tokens import TokenTable
from samplechain.grammar.tree_ranges import cover, ranges

LOOP_LEAVERS = 4  # a loop is skipped over when at most 1 / LOOP_LEAVERS of the tree's nodes leave it
UNKNOWN = object()


class Group:
    """An interned stack set as the walk uses it: its stacks, those topped by a character set (``live``), a bit
    per distinct top (in position order, so a code means the same tops however the set was reached), whether it
    holds the empty stack (``popped``: the walked suffix is done), and its successors by code."""

    __slots__ = ("key", "live", "loop", "luts", "next", "popped", "stacks", "tops")

    def __init__(self, key: frozenset, stacks: tuple[Stack, ...], types: list[int]) -> None:
        self.key = key
        self.stacks = stacks
        self.live = [s for s in stacks if s and types[s[-1]] in CHARSET]
        self.tops = {top: bit for bit, top in enumerate(sorted({s[-1] for s in self.live}))}
        self.popped = () in key
        self.next: dict[int, Group] = {}
        self.luts: list[tuple[np.ndarray | int, int]] | None = None  # (table or code point index, bit) per top
        self.loop: object = UNKNOWN  # a Loop, or None when the set does not loop


class Loop:
    """For a group that the code points of a set S map back to itself: the tree nodes whose code point is not in
    S, ordered by (first position, depth)."""

    __slots__ = ("depth", "hi", "lo", "nodes", "tails_ok")

    def __init__(self, nodes: np.ndarray, lo: np.ndarray, hi: np.ndarray, depth: np.ndarray) -> None:
        self.nodes, self.lo, self.hi, self.depth = nodes, lo, hi, depth
        self.tails_ok: np.ndarray | None = None  # per token ending inside a character: can the loop complete it


class MaskGroups:
    """The groups of one grammar over one vocabulary, and its character sets over the vocabulary's tree (cached;
    the groups are bounded in number, and those in use stay valid when the cache is cleared)."""

    def __init__(self, grammar: Grammar, table: TokenTable) -> None:
        self.grammar = grammar
        self.table = table
        self.trie = table.trie
        self._groups: dict[frozenset, Group] = {}
        self._luts: dict[int, np.ndarray | int] = {}
        self._luts_by_set: dict[tuple, np.ndarray | int] = {}
        self._loop_kinds: dict[tuple, Loop | None] = {}
        self._firsts: dict[tuple, tuple[np.ndarray | None, np.ndarray]] = {}
        self._leaves: dict[bytes, tuple[np.ndarray, ...] | None] = {}
        self._prepare()

    # --- groups -------------------------------------------------------------------------------------------

    def group(self, stacks: tuple[Stack, ...]) -> Group:
        """The group of a stack set, interned."""
        return self._intern(frozenset(stacks), stacks)

    def _intern(self, key: frozenset, stacks: tuple[Stack, ...]) -> Group:
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) > 100_000:  # bounded; groups in use stay valid
                self._groups.clear()
            group = self._groups[key] = Group(key, stacks, self.grammar.types)
        return group

    def successor(self, group: Group, code: int) -> Group:
        """The group after a code point that matches exactly the tops in ``code`` (the union of their stacks'
        successors, llama.cpp's order)."""
        out: list[Stack] = []
        seen: set[Stack] = set()
        tops, step = group.tops, self.grammar.step
        for s in group.live:
            if code >> tops[s[-1]] & 1:
                for t in step(s):
                    if t not in seen:
                        seen.add(t)
                        out.append(t)
        group.next[code] = nxt = self._intern(frozenset(seen), tuple(out))
        return nxt

    def luts_of(self, group: Group) -> list[tuple[np.ndarray | int, int]]:
        """Each top of ``group`` as (its lookup table, its bit), kept on the group."""
        group.luts = [(self._lut(top), 1 << bit) for top, bit in group.tops.items()]
        return group.luts

    def loop(self, group: Group) -> Loop | None:
        """The nodes that leave ``group``, when the code points that keep it as it is cover most of the
        vocabulary's nodes; None otherwise (computed once per group, and once per kind of loop: the nodes depend
        only on the character sets and on which of their combinations keep the group)."""
        if group.loop is not UNKNOWN:
            return group.loop
        tr = self.trie
        loop = None
        luts = group.luts or self.luts_of(group)
        # a loop needs some top whose own successors are this very set (cheap test before any big array)
        if len(luts) <= 16 and any(self.successor(group, b) is group for _, b in luts):
            sets = tuple(self._set_key(top) for top in group.tops)
            if len(luts) <= 4:  # few tops: which combinations loop, without looking at the vocabulary
                kinds = (sets, tuple(c for c in range(1, 1 << len(luts)) if self.successor(group, c) is group))
                loop = self._loop_kinds.get(kinds, UNKNOWN)
                if loop is not UNKNOWN:
                    group.loop = loop
                    return loop
            code = np.zeros(len(tr.ucp), dtype=np.int64)  # per code point of the vocabulary, which tops match it
            for lut, b in luts:
                if type(lut) is not int:
                    code[lut] |= b
                elif lut >= 0:
                    code[lut] |= b
            stays = np.zeros(1 << len(luts), dtype=bool)
            for c in np.flatnonzero(np.bincount(code)).tolist():
                stays[c] = c > 0 and self.successor(group, c) is group
            leaving = self._leaving(np.flatnonzero(~stays[code]))
            if leaving is not None:
                loop = Loop(*leaving)
            if len(luts) <= 4:
                self._loop_kinds[kinds] = loop
        group.loop = loop
        return loop

    # --- character sets over the tree ---------------------------------------------------------------------

    def first(self, top: int) -> tuple[np.ndarray | None, np.ndarray]:
        """What the character set at ``top`` takes as a token's first character: the tokens with no whole character
        whose partial one it can complete, and the depth-0 nodes (first code points, in order) it matches. Shared
        by equal sets."""
        key = self._set_key(top)
        first = self._firsts.get(key)
        if first is None:
            tt, cs, cps = self.table, self.grammar.charsets[top], self.trie.root_cps
            extra = None
            if len(tt.partial_only):
                low, high = tt.partial_only_range
                extra = tt.partial_only[cs.can_complete_many(low, high)]
            if cs.any:
                nodes = np.arange(len(cps))
            else:
                a = np.searchsorted(cps, cs.starts, side="left")
                b = np.searchsorted(cps, cs.ends, side="right")
                if cs.negated:
                    a, b = np.concatenate([[0], b]), np.concatenate([a, [len(cps)]])
                nodes = ranges(a, b)
            first = self._firsts[key] = (extra if extra is not None and len(extra) else None, nodes)
        return first

    def partial_ok(self, group: Group, pos: np.ndarray) -> np.ndarray:
        """For tokens (positions) that end inside a UTF-8 sequence: can a live character set of ``group``
        complete it?"""
        tr, charsets = self.trie, self.grammar.charsets
        low, high = tr.plow[pos], tr.phigh[pos]
        ok = np.zeros(len(pos), dtype=bool)
        for top in group.tops:
            ok |= charsets[top].can_complete_many(low, high)
        return ok

    def _leaving(self, leave: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """The tree nodes whose code point is one of ``leave`` (indices into ``ucp``), by (position, depth), with
        their positions and depths; None when they are too many for a skip to pay. Cached by the set."""
        key = leave.tobytes()
        if key in self._leaves:
            return self._leaves[key]
        tr = self.trie
        starts, stops = tr.ucp_start[leave], tr.ucp_start[leave + 1]
        out = None
        if int((stops - starts).sum()) * LOOP_LEAVERS <= len(tr.cp):
            at = ranges(starts, stops)
            nodes = tr.by_cp[at[np.argsort(tr.by_cp_key[at], kind="stable")]]  # by (position, depth): merged runs
            out = (nodes, tr.lo[nodes], tr.hi[nodes], tr.depth[nodes])
        if len(self._leaves) > 256:
            self._leaves.clear()
        self._leaves[key] = out
        return out

    def _prepare(self) -> None:
        """Work that depends on the grammar's character sets only, done with the grammar (part of its compile
        time): each set's lookup table and first characters, and for a set that takes almost every character (a
        string's contents), the nodes that leave a loop over it."""
        for top in self.grammar.charsets:
            self.first(top)
            lut = self._lut(top)
            if type(lut) is not int and lut.mean() > 0.5:
                self._leaving(np.flatnonzero(~lut))

    def _set_key(self, top: int) -> tuple:
        cs = self.grammar.charsets[top]
        return cs.intervals, cs.negated, cs.any

    def _lut(self, top: int) -> np.ndarray | int:
        """The character set at ``top`` over the vocabulary's distinct code points (``ucp``): a lookup table, or
        for a single code point its index there (-1: no token has it). Shared by equal sets (the levels of
        ``[ \\t]{0,20}`` are one set)."""
        lut = self._luts.get(top)
        if lut is None:
            cs, ucp = self.grammar.charsets[top], self.trie.ucp
            key = self._set_key(top)
            lut = self._luts_by_set.get(key)
            if lut is None:
                if cs.any:
                    lut = np.ones(len(ucp), dtype=bool)
                elif not cs.negated and len(cs.intervals) == 1 and cs.intervals[0][0] == cs.intervals[0][1]:
                    i = int(np.searchsorted(ucp, cs.intervals[0][0]))
                    lut = i if i < len(ucp) and ucp[i] == cs.intervals[0][0] else -1
                else:
                    lut = cover(np.searchsorted(ucp, cs.starts, side="left"),
                                np.searchsorted(ucp, cs.ends, side="right"), len(ucp))
                    if cs.negated:
                        lut = ~lut
                self._luts_by_set[key] = lut
            self._luts[top] = lut
        return lut
