"""The stack sets (groups) that the walk behind token masks (``mask_walk.py``) meets, interned with their successors
by code point, and the grammar's character sets over the vocabulary's prefix tree (``tokens.TokenTrie``): each set's
lookup table over the tree's distinct code points, its first nodes, the tokens whose partial character it can
complete, its code points when they are few (a literal's), and for a group that maps itself to itself on most code
points (a string's contents), the nodes that leave that loop and the skip over it (``block``: the tokens allowed
whole, and the nodes the walk goes on from).

Everything here depends on the grammar and the vocabulary only, not on the state being masked: it is built once per
``MaskEngine`` (the character sets' tables with the grammar, as part of its compile time) and shared by every walk.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from samplechain.grammar.engine import CHARSET, Grammar, Stack
from samplechain.grammar.tokens import TokenTable
from samplechain.grammar.tree_ranges import cover, merged, outermost, ranges

LOOP_LEAVERS = 4  # a loop is skipped over when at most 1 / LOOP_LEAVERS of the tree's nodes leave it
POINTS_MAX = 8  # a group whose tops take at most this many code points finds its nodes' children by bisection
UNKNOWN = object()


class Group:
    """An interned stack set as the walk uses it: its stacks, those topped by a character set (``live``), a bit
    per distinct top (in position order, so a code means the same tops however the set was reached), whether it
    holds the empty stack (``popped``: the walked suffix is done), and its successors by code."""

    __slots__ = ("key", "live", "loop", "luts", "next", "points", "popped", "stacks", "tops")

    def __init__(self, key: frozenset, stacks: tuple[Stack, ...], types: list[int]) -> None:
        self.key = key
        self.stacks = stacks
        if len(stacks) == 1:  # most groups: one stack
            s = stacks[0]
            live = s and types[s[-1]] in CHARSET
            self.live = [s] if live else []
            self.tops = {s[-1]: 0} if live else {}
            self.popped = not s
        else:
            self.live = [s for s in stacks if s and types[s[-1]] in CHARSET]
            self.tops = {top: bit for bit, top in enumerate(sorted({s[-1] for s in self.live}))}
            self.popped = () in key
        self.next: dict[int, Group] = {}
        self.luts: list[tuple[np.ndarray | int, int]] | None = None  # (table or code point index, bit) per top
        self.points: list[int] | None = None  # with luts: the few code points its tops take (indices into ucp)
        self.loop: object = UNKNOWN  # a Loop, or None when the set does not loop


class Loop:
    """For a group that the code points of a set S map back to itself: the tree nodes whose code point is not in
    S, ordered by (first position, depth); ``key`` names the set of code points that leave."""

    __slots__ = ("depth", "hi", "key", "lo", "nodes", "tails_ok")

    def __init__(self, key: object, nodes: np.ndarray, lo: np.ndarray, hi: np.ndarray, depth: np.ndarray) -> None:
        self.key = key
        self.nodes, self.lo, self.hi, self.depth = nodes, lo, hi, depth
        self.tails_ok: np.ndarray | None = None  # per token ending inside a character: can the loop complete it


class Block(NamedTuple):
    """A skip over a loop below some nodes: the tokens allowed whole (sorted ranges of positions), which of the
    tokens ending inside a character lie in them (``inside``, over ``TokenTrie.ptail``: allowed when the loop's
    character sets can complete them), the leaving nodes the walk goes on from (``sel``, indices into the loop's
    nodes), whether the ranges took the tokens ending at the arrived nodes too (``took``), and how many tokens lie
    below the nodes (``below``: a skip pays when they are many)."""

    starts: np.ndarray
    stops: np.ndarray
    inside: np.ndarray
    sel: np.ndarray
    took: bool
    below: int


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
        self._points_by_set: dict[tuple, object] = {}
        self._points_of: dict[int, object] = {}
        self._loop_kinds: dict[tuple, Loop | None] = {}
        self._firsts: dict[tuple, tuple[np.ndarray | None, np.ndarray]] = {}
        self._leaves: dict[object, tuple[np.ndarray, ...] | None] = {}
        self._root_blocks: dict[tuple, Block | None] = {}
        self.wide: set[int] = set()  # the character sets (positions) that take most of the vocabulary's characters
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
        if len(group.live) == 1:  # one stack: its successors, each once already
            out = self.grammar.step(group.live[0]) if code & 1 else ()
            group.next[code] = nxt = self._intern(frozenset(out), out)
            return nxt
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
        lut, points = self._lut, self._points
        group.luts = luts = [(lut(top), 1 << bit) for top, bit in group.tops.items()]
        if len(luts) == 1:
            some = points(next(iter(group.tops)))
            group.points = some if some is not None and len(some) <= POINTS_MAX else None
            return luts
        union: set[int] = set()
        for top in group.tops:
            some = points(top)
            if some is None:
                return luts
            union.update(some)
        if len(union) <= POINTS_MAX:
            group.points = sorted(union)
        return luts

    def loop(self, group: Group) -> Loop | None:
        """The nodes that leave ``group``, when the code points that keep it as it is cover most of the
        vocabulary's nodes; None otherwise (computed once per group, and once per kind of loop: the nodes depend
        only on the character sets and on which of them keep the group).

        A code point keeps the group when the tops that match it are all tops whose successors are the group
        again (the successors of several tops are the union of theirs); one that some other top matches leaves it
        (walked on, never skipped)."""
        if group.loop is not UNKNOWN:
            return group.loop
        loop = None
        luts = group.luts or self.luts_of(group)
        stay = [i for i, (_, b) in enumerate(luts) if self.successor(group, b) is group] if len(luts) <= 16 else []
        if stay:
            kinds = (tuple(self._set_key(top) for top in group.tops), tuple(stay))
            loop = self._loop_kinds.get(kinds, UNKNOWN)
            if loop is UNKNOWN:
                loop = self._loop_of(group, luts, stay)
                if len(self._loop_kinds) > 4096:
                    self._loop_kinds.clear()
                self._loop_kinds[kinds] = loop
        group.loop = loop
        return loop

    def _loop_of(self, group: Group, luts: list[tuple[np.ndarray | int, int]], stay: list[int]) -> Loop | None:
        """The loop of ``group`` whose tops ``stay`` (indices into ``luts``) keep it."""
        if len(stay) == 1 and type(luts[stay[0]][0]) is not int:
            own = luts[stay[0]][0]
            if all(lut < 0 or not own[lut] if type(lut) is int else not (own & lut).any()
                   for i, (lut, _) in enumerate(luts) if i != stay[0]):  # no other top shares a code point
                top = list(group.tops)[stay[0]]
                leaving = self._leaving(("not", self._set_key(top)), own)
                return None if leaving is None else Loop(("not", self._set_key(top)), *leaving)
        keep = np.zeros(len(self.trie.ucp), dtype=bool)
        for i, (lut, _) in enumerate(luts):
            if i in stay:
                if type(lut) is not int:
                    keep |= lut
                elif lut >= 0:
                    keep[lut] = True
        for i, (lut, _) in enumerate(luts):
            if i not in stay:
                if type(lut) is not int:
                    keep &= ~lut
                elif lut >= 0:
                    keep[lut] = False
        key = np.flatnonzero(~keep).tobytes()
        leaving = self._leaving(key, keep)
        return None if leaving is None else Loop(key, *leaving)

    def block(self, loop: Loop, nodes: np.ndarray, arrived: np.ndarray | None) -> Block:
        """The skip over ``loop`` below ``nodes``: the tokens whose further code points all stay in the loop are
        allowed, as a block; the walk goes on from the first node on each path that leaves it. When the nodes
        ``arrived`` (``nodes`` and others without children) are of one depth and in order, the block takes the
        tokens ending at them too: their subtrees join into few ranges."""
        tr = self.trie
        lo, hi = tr.lo[nodes], tr.hi[nodes]
        if len(lo) > 1 and not ((lo[1:] > lo[:-1]).all() and (hi[:-1] <= lo[1:]).all()):  # not apart and in order
            order = np.lexsort((tr.depth[nodes], lo))
            nodes, lo = nodes[order], lo[order]
            nodes = nodes[outermost(lo, tr.hi[nodes])]  # the same node twice, or one below another
            lo, hi = tr.lo[nodes], tr.hi[nodes]
            arrived = None
        # the leaving nodes below them: those in their ranges of positions (the loop's nodes are by position, then
        # depth), less the nodes themselves and those above them that start where they do
        a, b = np.searchsorted(loop.lo, lo), np.searchsorted(loop.lo, hi)
        sel = ranges(a, b)
        sel = sel[loop.depth[sel] > np.repeat(tr.depth[nodes], b - a)]
        out_lo, out_hi = loop.lo[sel], loop.hi[sel]
        first = outermost(out_lo, out_hi)  # the first leaving node of each path
        sel, out_lo, out_hi = sel[first], out_lo[first], out_hi[first]
        if arrived is not None and len(arrived) > len(nodes):
            a_lo, a_hi = tr.lo[arrived], tr.hi[arrived]
            if (a_lo[1:] > a_lo[:-1]).all() and (a_hi[:-1] <= a_lo[1:]).all():
                lo, hi = a_lo, a_hi
            else:
                arrived = None
        # the subtrees less those of the leaving nodes, which lie inside them and apart: every bound switches
        lo, hi = merged(lo, hi)
        edges = np.concatenate([lo, hi, out_lo, out_hi])
        edges.sort(kind="stable")  # four sorted runs
        starts, stops = edges[0::2], edges[1::2]
        k = np.searchsorted(starts, tr.ptail, side="right") - 1
        inside = (k >= 0) & (tr.ptail < stops[np.maximum(k, 0)])
        return Block(starts, stops, inside, sel, arrived is not None, int(tr.below[nodes].sum()))

    def root_block(self, top: int, loop: Loop) -> Block | None:
        """:meth:`block` below the first nodes of the character set at ``top`` (all of them arrived; None when none
        has children): shared by equal sets and loops, and made with the grammar for the sets that take almost
        every character (a string's contents), whose walks start that way."""
        key = (self._set_key(top), loop.key)
        if key not in self._root_blocks:
            tr = self.trie
            nodes = self.first(top)[1]
            below = nodes[tr.below[nodes] > 0]
            if len(self._root_blocks) > 256:
                self._root_blocks.clear()
            self._root_blocks[key] = self.block(loop, below, nodes) if len(below) else None
        return self._root_blocks[key]

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

    def _leaving(self, key: object, keep: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """The tree nodes whose code point is not one that ``keep`` (over ``ucp``) holds, by (position, depth), with
        their positions and depths; None when they are too many for a skip to pay. Cached by ``key``, which names
        that set of code points."""
        if key in self._leaves:
            return self._leaves[key]
        tr = self.trie
        leave = np.flatnonzero(~keep)
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
        string's contents), the nodes that leave a loop over it and the skip over that loop from its first
        characters."""
        for top in self.grammar.charsets:
            self.first(top)
            lut = self._lut(top)
            if type(lut) is not int and lut.mean() > 0.5:
                self.wide.add(top)
                key = ("not", self._set_key(top))
                leaving = self._leaving(key, lut)
                if leaving is not None:
                    self.root_block(top, Loop(key, *leaving))

    def _points(self, top: int) -> list[int] | None:
        """The code points (indices into ``ucp``) of the set at ``top`` when it has at most ``POINTS_MAX`` of the
        vocabulary's, else None (shared by equal sets)."""
        points = self._points_of.get(top, UNKNOWN)
        if points is UNKNOWN:
            key = self._set_key(top)
            points = self._points_by_set.get(key, UNKNOWN)
            if points is UNKNOWN:
                lut = self._lut(top)
                if type(lut) is int:
                    points = [lut] if lut >= 0 else []
                else:
                    points = np.flatnonzero(lut).tolist() if int(np.count_nonzero(lut)) <= POINTS_MAX else None
                self._points_by_set[key] = points
            self._points_of[top] = points
        return points

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
