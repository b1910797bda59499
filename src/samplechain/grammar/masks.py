"""Allowed-token masks of a grammar's states over a vocabulary, apart from the matcher: a walk of the vocabulary's
prefix tree, vectorised with NumPy where many nodes go the same way.

llama.cpp decides each token alone (src/llama-grammar.cpp: ``llama_grammar_reject_candidates`` walks every
candidate's code points through the stacks). Here a mask walks the vocabulary's prefix tree (``TokenTrie``): the
nodes reached with the same stack set form a group; a group's children are split by which character sets their
code point matches, and each part moves on to the union of the matching stacks' successors. A token is allowed when
its node is reached with some stack alive (and, when its text ends inside a UTF-8 sequence, a live character set
can still complete it). A prefix shared by many tokens is walked once, and most subtrees die at their first code
point. Large groups are split with NumPy, a few nodes one by one in Python (where NumPy's cost per call would
dominate). A group whose stack set maps itself to itself on most code points (a string's contents) is not walked
at all: its subtrees are allowed whole, less the subtrees of the first node on each path whose code point leaves
the loop, and the walk goes on from those.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from samplechain.grammar.engine import _CHARSET, Grammar, Stack, State, check_budget
from samplechain.grammar.parser import TOKEN, TOKEN_NOT
from samplechain.grammar.tokens import TokenTable

POP_MAX = 256  # nodes that may pop out of a suffix at its first character before a longer suffix is walked instead
LOOP_MIN = 1024  # tokens below a self-looping group worth skipping over instead of walking
FEW = 8  # at most this many nodes are walked one by one
LOOP_LEAVERS = 4  # a loop is skipped over when at most 1 / LOOP_LEAVERS of the tree's nodes leave it
_UNKNOWN = object()


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[lo, hi)``, concatenated in order (empty ranges contribute nothing)."""
    if len(lo) == 1:
        return np.arange(lo[0], hi[0])
    n = hi - lo
    keep = n > 0
    if not keep.all():
        lo, n = lo[keep], n[keep]
    if not len(n):
        return lo
    ends = np.cumsum(n)
    if ends[-1] == len(n):
        return lo
    return np.arange(ends[-1]) + np.repeat(lo - (ends - n), n)


def _cover(lo: np.ndarray, hi: np.ndarray, size: int) -> np.ndarray:
    """A bool array of ``size``, True on the sorted disjoint ranges ``[lo, hi)``."""
    edges = np.empty(2 * len(lo) + 2, dtype=np.int64)
    edges[0], edges[-1] = 0, size
    edges[1:-1:2], edges[2:-1:2] = lo, hi
    values = np.zeros(len(edges) - 1, dtype=bool)
    values[1::2] = True
    return np.repeat(values, np.diff(edges))


def _merged(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint ranges with the touching ones joined."""
    if len(lo) < 2:
        return lo, hi
    gap = lo[1:] != hi[:-1]
    return lo[np.concatenate([[True], gap])], hi[np.concatenate([gap, [True]])]


def _outermost(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Of tree nodes sorted by (first position, depth), those below no other one of them (tree nodes' position
    ranges nest or are disjoint, so a node is below an earlier one exactly when it starts before that one ends)."""
    keep = np.ones(len(lo), dtype=bool)
    if len(lo) > 1:
        keep[1:] = lo[1:] >= np.maximum.accumulate(hi)[:-1]
    return keep


class _Group:
    """An interned stack set as the walk uses it: its stacks, those topped by a character set (``live``), a bit
    per distinct top (in position order, so a code means the same tops however the set was reached), whether it
    holds the empty stack (``popped``: the walked suffix is done), and its successors by code."""

    __slots__ = ("key", "live", "loop", "luts", "next", "popped", "stacks", "tops")

    def __init__(self, key: frozenset, stacks: tuple[Stack, ...], types: list[int]) -> None:
        self.key = key
        self.stacks = stacks
        self.live = [s for s in stacks if s and types[s[-1]] in _CHARSET]
        self.tops = {top: bit for bit, top in enumerate(sorted({s[-1] for s in self.live}))}
        self.popped = () in key
        self.next: dict[int, _Group] = {}
        self.luts: list[tuple[np.ndarray | int, int]] | None = None  # (table or code point index, bit) per top
        self.loop: object = _UNKNOWN  # a _Loop, or None when the set does not loop


class _Loop:
    """For a group that the code points of a set S map back to itself: the tree nodes whose code point is not in
    S, ordered by (first position, depth)."""

    __slots__ = ("depth", "hi", "lo", "nodes", "tails_ok")

    def __init__(self, nodes: np.ndarray, lo: np.ndarray, hi: np.ndarray, depth: np.ndarray) -> None:
        self.nodes, self.lo, self.hi, self.depth = nodes, lo, hi, depth
        self.tails_ok: np.ndarray | None = None  # per token ending inside a character: can the loop complete it


class _Deeper(Exception):
    """A suffix popped out with too many tokens: walk a longer one."""


class _Local:
    """The walk of one stack suffix over a set of tree nodes: the tokens it decides alone, and the nodes (of any
    depths) where the suffix was done with text left, for the rest of the stack to go on from."""

    __slots__ = ("accepted", "pops")

    def __init__(self, accepted: np.ndarray, pops: np.ndarray | None) -> None:
        self.accepted = accepted  # a bool array over the vocabulary when dense, else token ids
        self.pops = pops

    def nbytes(self) -> int:
        return self.accepted.nbytes + (0 if self.pops is None else self.pops.nbytes) + 200

    def mark(self, allowed: np.ndarray) -> None:
        if self.accepted.dtype == bool:
            allowed |= self.accepted
        else:
            allowed[self.accepted] = True


class _Walk:
    """One local walk in progress: what it accepted, where it popped, and the nodes to test next by group."""

    __slots__ = ("accepted", "blocks", "ended", "few_ended", "few_pops", "next", "pop_room", "pops")

    def __init__(self, pop_room: int) -> None:
        self.pop_room = pop_room  # how many more nodes may pop before the walk gives up (-1: no limit)
        self.accepted: list[np.ndarray] = []  # positions
        self.blocks: list[tuple[np.ndarray, ...]] = []  # (starts, stops, positions inside that are not) from skips
        self.ended: list[np.ndarray] = []  # nodes reached alive: their whole-character tokens are allowed
        self.few_ended: list[int] = []  # positions of whole-character tokens ending at such nodes
        self.pops: list[np.ndarray] = []
        self.few_pops: list[int] = []
        self.next: dict[_Group, list] = {}  # group -> [node arrays, node list]: whose code points to test

    def queue(self, group: _Group, nodes: np.ndarray | None = None, few: list[int] | range | None = None) -> None:
        entry = self.next.get(group)
        if entry is None:
            entry = self.next[group] = [[], []]
        if nodes is not None:
            entry[0].append(nodes)
        if few:
            entry[1].extend(few)


class MaskEngine:
    """Allowed-token masks of a grammar's states over one vocabulary.

    A state's mask is the union of its stacks' masks. A stack's mask is the cached walk of its top entries
    (context-independent: the same for a string wherever it occurs) plus the few tokens that pop out of that
    suffix, finished against the rest of the stack (context-dependent). State masks are cached (LRU, bounded in
    bytes).
    """

    def __init__(self, grammar: Grammar, table: TokenTable, cache_bytes: int = 64 << 20) -> None:
        self.grammar = grammar
        self.table = table
        self.trie = table.trie
        self._rows = table.trie.node_rows.T  # a node's (cpi, lo, end, pend, hi, clo, chi) in one read
        self._cache: OrderedDict[State, np.ndarray] = OrderedDict()
        self._local: OrderedDict[tuple, _Local] = OrderedDict()
        self._cache_max = max(4, cache_bytes // max(1, table.n))
        self._local_bytes, self._local_max = 0, cache_bytes  # walks are mostly small: bounded by their bytes
        self._groups: dict[frozenset, _Group] = {}
        self._luts: dict[int, np.ndarray | int] = {}
        self._luts_by_set: dict[tuple, np.ndarray | int] = {}
        self._loop_kinds: dict[tuple, _Loop | None] = {}
        self._firsts: dict[tuple, tuple[np.ndarray | None, np.ndarray]] = {}
        self._leaves: dict[bytes, tuple[np.ndarray, ...] | None] = {}
        self._prepare()
        self._eog = frozenset(table.eog.tolist())
        self._depths: dict[int, int] = {}  # per top position: the suffix length its walks need

    def transition(self, state: State, token: int) -> State | None:
        return self.grammar.transition(state, token, self.table.pieces[token])

    def allows(self, state: State, token: int) -> bool:
        """Whether one token is allowed (the rejection-sampling check): a cached mask, or one transition."""
        mask = self._cache.get(state)
        if mask is not None:
            return bool(mask[token])
        if token in self._eog:
            return () in state.stacks
        return self.transition(state, token) is not None

    def mask(self, state: State) -> np.ndarray:
        """Boolean array over the vocabulary: True where the grammar allows the token (read-only, cached)."""
        m = self._cache.get(state)
        if m is not None:
            self._cache.move_to_end(state)
            return m
        m = self._compute(state)
        m.flags.writeable = False
        self._cache[state] = m
        if len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)
        return m

    def _compute(self, state: State) -> np.ndarray:
        g, tt = self.grammar, self.table
        allowed = np.zeros(tt.n, dtype=bool)
        if () in state.stacks:
            allowed[tt.eog] = True
        if state.partial[1] != 0:  # a character is pending: only continuation-led tokens can go on
            for t in tt.cont_start:
                allowed[t] = g.transition(state, t, tt.pieces[t]) is not None
            return allowed
        types = g.types
        for s in state.stacks:
            if not s:
                continue
            top = s[-1]
            if types[top] == TOKEN:
                v = g.values[top]
                if v < tt.n and tt.by_id[v]:
                    allowed[v] = True
            elif types[top] == TOKEN_NOT:  # every token but one; other stacks may still allow that one
                v = g.values[top]
                keep = bool(allowed[v]) if v < tt.n else False
                allowed |= tt.by_id
                if v < tt.n:
                    allowed[v] = keep
        for s in state.stacks:
            if s and types[s[-1]] in _CHARSET:
                self._stack_into(s, None, None, allowed)
        return allowed

    def _stack_into(self, s: Stack, source: tuple | None, parents: np.ndarray | None, allowed: np.ndarray) -> None:
        """Mark the tokens that stack ``s`` takes: every token (``parents`` None), or those below the tree nodes
        ``parents``, whose code points so far the stacks above ``s`` consumed.

        Only the top entries of ``s`` are walked (its *suffix*); the walk is cached by (suffix, ``source``: what
        names the nodes), so that a suffix is walked once wherever it occurs (a string's contents, a run of
        whitespace). The tokens that pop out of the suffix with text left continue, from where they popped,
        through each stack below. A suffix is as short as it can be: one entry, or more when one entry pops
        out at once with many tokens, or pops into the same top again (a repetition whose every step ends the
        rule: ``char*``); found once per top.
        """
        depth = self._depths.get(s[-1], 1)
        while True:
            suffix = s[-depth:]
            key = (suffix, source)
            local = self._local.get(key)
            if local is not None:
                self._local.move_to_end(key)
                break
            try:
                local = self._local_walk(suffix, parents, depth < len(s))
            except _Deeper:
                depth += 1
                self._depths[s[-1]] = depth
                continue
            self._local[key] = local
            self._local_bytes += local.nbytes()
            while self._local_bytes > self._local_max and len(self._local) > 1:
                self._local_bytes -= self._local.popitem(last=False)[1].nbytes()
            break
        local.mark(allowed)
        if len(s) > depth and local.pops is not None:
            types = self.grammar.types
            for r in self.grammar.advance(s[:-depth]):  # empty and token-topped stacks refuse unfinished text
                if r and types[r[-1]] in _CHARSET:
                    if r[-1] == s[-1] and self._depths.get(r[-1], 1) <= depth:
                        self._depths[r[-1]] = depth + 1  # the rule repeats itself from below: walk more of it
                    self._stack_into(r, key, local.pops, allowed)

    # --- the walk -----------------------------------------------------------------------------------------

    def _local_walk(self, suffix: Stack, parents: np.ndarray | None, may_deepen: bool) -> _Local:
        """The walk of ``suffix`` over every token (``parents`` None) or below ``parents``. With ``may_deepen``,
        raises ``_Deeper`` when the suffix pops out at its first character with many nodes (a repetition such as
        ``char*`` ends its rule at every step: walking a longer suffix, that can skip over the loop, is cheaper)."""
        tr = self.trie
        own = self._group((suffix,))
        walk = _Walk(POP_MAX if may_deepen else -1)
        extra = None  # accepted token ids outside the tree
        if parents is None:
            extra, nodes = self._first(suffix[-1])
            if len(nodes) <= FEW:
                self._walk_few(own, nodes.tolist(), walk)
            else:
                nxt = own.next.get(1) or self._successor(own, 1)
                if nxt.popped and len(nodes) > walk.pop_room >= 0:
                    raise _Deeper
                self._arrive(nxt, nodes, walk)
        else:
            pos = _ranges(tr.end[parents], tr.pend[parents])
            if len(pos):
                walk.accepted.append(pos[self._partial_ok(own, pos)])
            walk.queue(own, _ranges(tr.clo[parents], tr.chi[parents]))
        if parents is None:
            walk.pop_room = -1  # only a suffix that pops at once, with many nodes, is deepened
        while walk.next:
            check_budget()
            arrivals: dict[_Group, list[np.ndarray]] = {}
            todo, walk.next = walk.next, {}
            for group, (arrays, few) in todo.items():
                total = len(few) + sum(len(a) for a in arrays)
                if total <= FEW:
                    for a in arrays:
                        few.extend(a.tolist())
                    self._walk_few(group, few, walk)
                    continue
                if few:
                    arrays.append(np.array(few, dtype=np.int64))
                cand = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
                self._split(group, cand, arrivals)
            for group, parts in arrivals.items():
                self._arrive(group, parts[0] if len(parts) == 1 else np.concatenate(parts), walk)
            walk.pop_room = -1
        if walk.few_ended:
            walk.accepted.append(np.array(walk.few_ended, dtype=np.int64))
        if walk.ended:
            ended = walk.ended[0] if len(walk.ended) == 1 else np.concatenate(walk.ended)
            walk.accepted.append(_ranges(tr.lo[ended], tr.end[ended]))
        if walk.few_pops:
            walk.pops.append(np.array(walk.few_pops, dtype=np.int64))
        pops = None
        if walk.pops:  # one array of nodes (of any depths), each once
            pops = walk.pops[0] if len(walk.pops) == 1 else np.unique(np.concatenate(walk.pops))
        return _Local(self._to_ids(walk, extra), pops)

    def _split(self, group: _Group, cand: np.ndarray, arrivals: dict[_Group, list[np.ndarray]]) -> None:
        """Split nodes by which of ``group``'s character sets their code point matches (vectorised)."""
        luts = group.luts or self._group_luts(group)
        cps = self.trie.cpi[cand]
        if len(luts) == 1:
            lut = luts[0][0]
            parts = [(1, cand[cps == lut] if type(lut) is int else cand[lut[cps]])]
        else:
            code = np.zeros(len(cand), dtype=np.int64)
            for lut, b in luts:
                code[cps == lut if type(lut) is int else lut[cps]] |= b
            present = np.flatnonzero(np.bincount(code)) if len(luts) <= 16 else np.unique(code)
            parts = [(c, cand if len(present) == 1 else cand[code == c]) for c in present.tolist() if c]
        for c, nodes in parts:
            if len(nodes):
                nxt = group.next.get(c) or self._successor(group, c)
                entry = arrivals.get(nxt)
                if entry is None:
                    arrivals[nxt] = [nodes]
                else:
                    entry.append(nodes)

    def _arrive(self, group: _Group, nodes: np.ndarray, walk: _Walk) -> None:
        """Nodes whose code points left ``group``'s stacks alive: accept the tokens ending there, record a pop,
        and queue the children (or skip over a loop)."""
        tr = self.trie
        partial = tr.partial_end[nodes]
        more = tr.below[nodes] > 0
        if group.popped:  # the suffix is done: the rest of the stack goes on from here (and may complete partials)
            out = nodes[more | partial]
            if len(out):
                walk.pops.append(out)
                if walk.pop_room >= 0:
                    walk.pop_room -= len(out)
                    if walk.pop_room < 0:
                        raise _Deeper
        if group.live and self._go_on(group, nodes if more.all() else nodes[more], walk, nodes):
            return  # a skip took the tokens ending at the nodes too
        walk.ended.append(nodes)  # some stack is alive: the tokens ending here with whole characters are allowed
        if partial.any():  # a trailing partial character: a live character set must be able to complete it
            ends = nodes[partial]
            pos = _ranges(tr.end[ends], tr.pend[ends])
            walk.accepted.append(pos[self._partial_ok(group, pos)])

    def _go_on(self, group: _Group, nodes: np.ndarray, walk: _Walk, arrived: np.ndarray | None = None) -> bool:
        """Queue the children of ``nodes`` (which have some) to be tested by ``group``, or skip over a loop; True
        when the skip also took the tokens ending at ``arrived`` (``nodes`` and others without children, all of
        one depth and in order)."""
        tr = self.trie
        if not len(nodes):
            return False
        if not group.popped and group.loop is not None and int(tr.below[nodes].sum()) >= LOOP_MIN:
            loop = self._loop(group)
            if loop is not None:
                return self._skip(group, loop, nodes, walk, arrived)
        walk.queue(group, _ranges(tr.clo[nodes], tr.chi[nodes]))
        return False

    def _walk_few(self, group: _Group, nodes: list[int], walk: _Walk) -> None:
        """Split and arrive node by node, depth first, while the nodes stay few."""
        cpi, rows = self.trie.cpi, self._rows
        work: list[tuple[_Group, list[int] | range]] = [(group, nodes)]
        steps = 0
        while work:
            steps += 1
            if not steps & 63:
                check_budget()
            group, nodes = work.pop()
            luts = group.luts or self._group_luts(group)
            for n in nodes:
                ci = cpi[n]
                code = 0
                for lut, b in luts:
                    if (ci == lut) if type(lut) is int else lut[ci]:
                        code |= b
                if not code:
                    continue
                nxt = group.next.get(code) or self._successor(group, code)
                _, lo, end, pend, hi, clo, chi = rows[n].tolist()
                if end > lo:
                    walk.few_ended.extend(range(lo, end))
                if pend > end:  # a trailing partial character: a live character set must be able to complete it
                    pos = np.arange(end, pend)
                    walk.accepted.append(pos[self._partial_ok(nxt, pos)])
                if nxt.popped and hi > end:  # the suffix is done: the rest of the stack goes on from here
                    walk.few_pops.append(n)
                    if walk.pop_room >= 0:
                        walk.pop_room -= 1
                        if walk.pop_room < 0:
                            raise _Deeper
                if hi == pend or not nxt.live:
                    continue
                if chi - clo > FEW or (hi - pend >= LOOP_MIN and not nxt.popped and nxt.loop is not None):
                    self._go_on(nxt, np.array([n], dtype=np.int64), walk)  # NumPy, or a skip over a loop
                else:
                    work.append((nxt, range(clo, chi)))

    def _skip(self, group: _Group, loop: _Loop, nodes: np.ndarray, walk: _Walk, arrived: np.ndarray | None) -> bool:
        """The tokens below ``nodes`` in a group that loops: those whose further code points all stay in the loop
        are allowed, as a block; the walk goes on from the first node on each path that leaves it. When the nodes
        ``arrived`` (``nodes`` and others without children) are of one depth and in order, the block takes the
        tokens ending at them too (their partial characters checked against this group, as ``_arrive`` would):
        their subtrees join into few ranges. True then."""
        tr = self.trie
        lo, hi = tr.lo[nodes], tr.hi[nodes]
        if len(lo) > 1 and not ((lo[1:] > lo[:-1]).all() and (hi[:-1] <= lo[1:]).all()):  # not apart and in order
            order = np.lexsort((tr.depth[nodes], lo))
            nodes, lo = nodes[order], lo[order]
            nodes = nodes[_outermost(lo, tr.hi[nodes])]  # the same node twice, or one below another
            lo, hi = tr.lo[nodes], tr.hi[nodes]
            arrived = None
        depth = tr.depth[nodes]
        j = np.maximum(np.searchsorted(lo, loop.lo, side="right") - 1, 0)
        sel = np.flatnonzero((loop.lo >= lo[j]) & (loop.lo < hi[j]) & (loop.depth > depth[j]))
        out_lo, out_hi = loop.lo[sel], loop.hi[sel]
        first = _outermost(out_lo, out_hi)  # the first leaving node of each path
        sel, out_lo, out_hi = sel[first], out_lo[first], out_hi[first]
        if arrived is not None and len(arrived) > len(nodes):
            a_lo, a_hi = tr.lo[arrived], tr.hi[arrived]
            if (a_lo[1:] > a_lo[:-1]).all() and (a_hi[:-1] <= a_lo[1:]).all():
                lo, hi = a_lo, a_hi
            else:
                arrived = None
        # the subtrees less those of the leaving nodes, which lie inside them and apart: every bound switches
        lo, hi = _merged(lo, hi)
        edges = np.concatenate([lo, hi, out_lo, out_hi])
        edges.sort(kind="stable")  # four sorted runs
        starts, stops = edges[0::2], edges[1::2]
        if loop.tails_ok is None:  # ending inside a character: the loop's character sets must complete it
            loop.tails_ok = self._partial_ok(group, tr.ptail)
        k = np.searchsorted(starts, tr.ptail, side="right") - 1
        inside = (k >= 0) & (tr.ptail < stops[np.maximum(k, 0)])
        walk.blocks.append((starts, stops, tr.ptail[inside & ~loop.tails_ok]))
        if len(sel):
            walk.queue(group, loop.nodes[sel])
        return arrived is not None

    def _loop(self, group: _Group) -> _Loop | None:
        """The nodes that leave ``group``, when the code points that keep it as it is cover most of the
        vocabulary's nodes; None otherwise (computed once per group, and once per kind of loop: the nodes depend
        only on the character sets and on which of their combinations keep the group)."""
        if group.loop is not _UNKNOWN:
            return group.loop
        tr = self.trie
        loop = None
        luts = group.luts or self._group_luts(group)
        # a loop needs some top whose own successors are this very set (cheap test before any big array)
        if len(luts) <= 16 and any(self._successor(group, b) is group for _, b in luts):
            sets = tuple(self._set_key(top) for top in group.tops)
            if len(luts) <= 4:  # few tops: which combinations loop, without looking at the vocabulary
                kinds = (sets, tuple(c for c in range(1, 1 << len(luts)) if self._successor(group, c) is group))
                loop = self._loop_kinds.get(kinds, _UNKNOWN)
                if loop is not _UNKNOWN:
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
                stays[c] = c > 0 and self._successor(group, c) is group
            leaving = self._leaving(np.flatnonzero(~stays[code]))
            if leaving is not None:
                loop = _Loop(*leaving)
            if len(luts) <= 4:
                self._loop_kinds[kinds] = loop
        group.loop = loop
        return loop

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
            at = _ranges(starts, stops)
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
            self._first(top)
            lut = self._lut(top)
            if type(lut) is not int and lut.mean() > 0.5:
                self._leaving(np.flatnonzero(~lut))

    # --- helpers ------------------------------------------------------------------------------------------

    def _group(self, stacks: tuple[Stack, ...]) -> _Group:
        key = frozenset(stacks)
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) > 100_000:  # bounded; groups in use stay valid
                self._groups.clear()
            group = self._groups[key] = _Group(key, stacks, self.grammar.types)
        return group

    def _successor(self, group: _Group, code: int) -> _Group:
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
        key = frozenset(seen)
        nxt = self._groups.get(key)
        if nxt is None:
            if len(self._groups) > 100_000:  # bounded; groups in use stay valid
                self._groups.clear()
            nxt = self._groups[key] = _Group(key, tuple(out), self.grammar.types)
        group.next[code] = nxt
        return nxt

    def _group_luts(self, group: _Group) -> list[tuple[np.ndarray | int, int]]:
        group.luts = [(self._lut(top), 1 << bit) for top, bit in group.tops.items()]
        return group.luts

    def _first(self, top: int) -> tuple[np.ndarray | None, np.ndarray]:
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
                nodes = _ranges(a, b)
            first = self._firsts[key] = (extra if extra is not None and len(extra) else None, nodes)
        return first

    def _partial_ok(self, group: _Group, pos: np.ndarray) -> np.ndarray:
        """For tokens (positions) that end inside a UTF-8 sequence: can a live character set of ``group``
        complete it?"""
        tr, charsets = self.trie, self.grammar.charsets
        low, high = tr.plow[pos], tr.phigh[pos]
        ok = np.zeros(len(pos), dtype=bool)
        for top in group.tops:
            ok |= charsets[top].can_complete_many(low, high)
        return ok

    def _to_ids(self, walk: _Walk, extra: np.ndarray | None) -> np.ndarray:
        """What a walk accepted (positions, and blocks: sorted ranges of positions less some) as a dense mask over
        the vocabulary, or as token ids when few."""
        tr, n = self.trie, self.table.n
        parts = [a for a in walk.accepted if len(a)]
        count = sum(len(p) for p in parts)
        if not walk.blocks and count * 32 <= n:
            ids = tr.sorted_ids[np.concatenate(parts)] if parts else np.zeros(0, dtype=np.int64)
            return ids if extra is None or not len(extra) else np.concatenate([ids, extra])
        if len(walk.blocks) == 1 and tr.m - int((walk.blocks[0][1] - walk.blocks[0][0]).sum()) <= tr.m // 4:
            # one block of most tokens: every token of the tree, less the few outside the block
            starts, stops, out_pos = walk.blocks[0]
            out = tr.in_tree.copy()
            gaps = _ranges(np.concatenate([[0], stops]), np.concatenate([starts, [tr.m]]))
            out[tr.sorted_ids[gaps]] = False
            out[tr.sorted_ids[out_pos]] = False
        else:
            by_pos = np.zeros(tr.m + 1, dtype=bool)  # the last entry, False, for the tokens outside the tree
            for starts, stops, out_pos in walk.blocks:
                block = _cover(starts, stops, tr.m + 1)
                block[out_pos] = False
                by_pos |= block
            out = by_pos[tr.pos_of]
        if parts:
            out[tr.sorted_ids[np.concatenate(parts)]] = True
        if extra is not None:
            out[extra] = True
        return out

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
                    lut = _cover(np.searchsorted(ucp, cs.starts, side="left"),
                                 np.searchsorted(ucp, cs.ends, side="right"), len(ucp))
                    if cs.negated:
                        lut = ~lut
                self._luts_by_set[key] = lut
            self._luts[top] = lut
        return lut
