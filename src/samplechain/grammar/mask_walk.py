"""The walk behind token masks: which tokens one stack suffix takes, over the whole vocabulary or below some nodes
of its prefix tree (``tokens.TokenTrie``), and where the suffix is done with text left (for the rest of the stack,
``masks.MaskEngine``, to go on from there).

The nodes reached with the same stack set form a group (``mask_groups.Group``); a group's children are split by
which character sets their code point matches, and each part moves on to the group of the matching stacks'
successors. Large groups are split with NumPy, a few nodes one by one in Python (where NumPy's cost per call would
dominate). A group whose stack set maps itself to itself on most code points (a string's contents) is not walked
at all: its subtrees are allowed whole, less the subtrees of the first node on each path whose code point leaves
the loop, and the walk goes on from those (from a character set's first characters, that block is made once:
``MaskGroups.root_block``). A group whose tops take a few code points (a literal) finds the children with those
code points by bisection (``TokenTrie.cp_nodes``) instead of testing every child.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from samplechain.grammar.engine import Stack, check_budget
from samplechain.grammar.mask_groups import Group, Loop, MaskGroups
from samplechain.grammar.tree_ranges import cover, ranges, unique

POP_MAX = 256  # nodes that may pop out of a suffix at its first character before a longer suffix is walked instead
LOOP_MIN = 1024  # tokens below a self-looping group worth skipping over instead of walking
FEW = 8  # at most this many nodes are walked one by one


class Deeper(Exception):
    """A suffix popped out with too many tokens: walk a longer one."""


class Local:
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


class Walk:
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
        self.next: dict[Group, list] = {}  # group -> [node arrays, node list]: whose code points to test

    def queue(self, group: Group, nodes: np.ndarray | None = None, few: list[int] | range | None = None) -> None:
        entry = self.next.get(group)
        if entry is None:
            entry = self.next[group] = [[], []]
        if nodes is not None:
            entry[0].append(nodes)
        if few:
            entry[1].extend(few)


class MaskWalker:
    """Walks of stack suffixes over one vocabulary's prefix tree, for one grammar (its groups: ``groups``)."""

    def __init__(self, groups: MaskGroups) -> None:
        self.groups = groups
        self.table = groups.table
        self.trie = groups.trie
        self._rows = groups.trie.node_rows.T  # a node's (cpi, lo, end, pend, hi, clo, chi) in one read

    def walk_suffix(self, suffix: Stack, parents: np.ndarray | None, may_deepen: bool) -> Local:
        """The walk of ``suffix`` over every token (``parents`` None) or below ``parents``. With ``may_deepen``,
        raises ``Deeper`` when the suffix pops out at its first character with many nodes (a repetition such as
        ``char*`` ends its rule at every step: walking a longer suffix, that can skip over the loop, is cheaper)."""
        tr = self.trie
        own = self.groups.group((suffix,))
        walk = Walk(POP_MAX if may_deepen else -1)
        extra = None  # accepted token ids outside the tree
        if parents is None:
            extra, nodes = self.groups.first(suffix[-1])
            if len(nodes) <= FEW:
                self._walk_few(own, nodes.tolist(), walk)
            else:
                nxt = own.next.get(1) or self.groups.successor(own, 1)
                if nxt.popped and len(nodes) > walk.pop_room >= 0:
                    raise Deeper
                if not self._skip_first(nxt, suffix[-1], walk):
                    self._arrive(nxt, nodes, walk)
        else:
            pos = ranges(tr.end[parents], tr.pend[parents])
            if len(pos):
                walk.accepted.append(pos[self.groups.partial_ok(own, pos)])
            walk.queue(own, self._children(own, parents))
        if parents is None:
            walk.pop_room = -1  # only a suffix that pops at once, with many nodes, is deepened
        while walk.next:
            check_budget()
            arrivals: dict[Group, list[np.ndarray]] = {}
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
            walk.accepted.append(ranges(tr.lo[ended], tr.end[ended]))
        if walk.few_pops:
            walk.pops.append(np.array(walk.few_pops, dtype=np.int64))
        pops = None
        if walk.pops:  # one array of nodes (of any depths), each once
            pops = walk.pops[0] if len(walk.pops) == 1 else unique(np.concatenate(walk.pops))
        return Local(self._to_ids(walk, extra), pops)

    def _split(self, group: Group, cand: np.ndarray, arrivals: dict[Group, list[np.ndarray]]) -> None:
        """Split nodes by which of ``group``'s character sets their code point matches (vectorised)."""
        luts = group.luts or self.groups.luts_of(group)
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
                nxt = group.next.get(c) or self.groups.successor(group, c)
                entry = arrivals.get(nxt)
                if entry is None:
                    arrivals[nxt] = [nodes]
                else:
                    entry.append(nodes)

    def _arrive(self, group: Group, nodes: np.ndarray, walk: Walk) -> None:
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
                        raise Deeper
        if group.live and self._go_on(group, nodes if more.all() else nodes[more], walk, nodes):
            return  # a skip took the tokens ending at the nodes too
        walk.ended.append(nodes)  # some stack is alive: the tokens ending here with whole characters are allowed
        if partial.any():  # a trailing partial character: a live character set must be able to complete it
            ends = nodes[partial]
            pos = ranges(tr.end[ends], tr.pend[ends])
            walk.accepted.append(pos[self.groups.partial_ok(group, pos)])

    def _go_on(self, group: Group, nodes: np.ndarray, walk: Walk, arrived: np.ndarray | None = None) -> bool:
        """Queue the children of ``nodes`` (which have some) to be tested by ``group``, or skip over a loop; True
        when the skip also took the tokens ending at ``arrived`` (``nodes`` and others without children, all of
        one depth and in order)."""
        tr = self.trie
        if not len(nodes):
            return False
        if not group.popped and group.loop is not None and int(tr.below[nodes].sum()) >= LOOP_MIN:
            loop = self.groups.loop(group)
            if loop is not None:
                return self._skip(group, loop, nodes, walk, arrived)
        walk.queue(group, self._children(group, nodes))
        return False

    def _children(self, group: Group, nodes: np.ndarray) -> np.ndarray:
        """The children of ``nodes`` to test against ``group``: all of them, or when its tops take a few code
        points (a literal), those with these code points, found by bisection in their runs of ``cp_nodes``."""
        tr = self.trie
        if group.luts is None:
            self.groups.luts_of(group)
        if group.points is None:
            return ranges(tr.clo[nodes], tr.chi[nodes])
        clo, chi = tr.clo[nodes], tr.chi[nodes]
        found = []
        for ci in group.points:
            run = tr.cp_nodes[tr.ucp_start[ci] : tr.ucp_start[ci + 1]]
            if len(run):
                at = np.searchsorted(run, clo)
                kids = run[np.minimum(at, len(run) - 1)]
                found.append(kids[(at < len(run)) & (kids < chi)])
        if len(found) == 1:
            return found[0]
        return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    def _skip_first(self, group: Group, top: int, walk: Walk) -> bool:
        """When the first characters of the set at ``top`` lead to ``group`` and it loops with many tokens below
        them: skip over the loop from there at once (the block is made once per set and loop); True then."""
        if group.popped or not group.live or group.loop is None:
            return False
        loop = self.groups.loop(group)
        if loop is None:
            return False
        block = self.groups.root_block(top, loop)
        if block is None or block.below < LOOP_MIN:
            return False
        return self._skip(group, loop, None, walk, None, top)

    def _walk_few(self, group: Group, nodes: list[int], walk: Walk) -> None:
        """Split and arrive node by node, depth first, while the nodes stay few."""
        cpi, rows = self.trie.cpi, self._rows
        work: list[tuple[Group, list[int] | range]] = [(group, nodes)]
        steps = 0
        while work:
            steps += 1
            if not steps & 63:
                check_budget()
            group, nodes = work.pop()
            luts = group.luts or self.groups.luts_of(group)
            for n in nodes:
                ci = cpi[n]
                code = 0
                for lut, b in luts:
                    if (ci == lut) if type(lut) is int else lut[ci]:
                        code |= b
                if not code:
                    continue
                nxt = group.next.get(code) or self.groups.successor(group, code)
                _, lo, end, pend, hi, clo, chi = rows[n].tolist()
                if end > lo:
                    walk.few_ended.extend(range(lo, end))
                if pend > end:  # a trailing partial character: a live character set must be able to complete it
                    pos = np.arange(end, pend)
                    walk.accepted.append(pos[self.groups.partial_ok(nxt, pos)])
                if nxt.popped and hi > end:  # the suffix is done: the rest of the stack goes on from here
                    walk.few_pops.append(n)
                    if walk.pop_room >= 0:
                        walk.pop_room -= 1
                        if walk.pop_room < 0:
                            raise Deeper
                if hi == pend or not nxt.live:
                    continue
                if hi - pend >= LOOP_MIN and not nxt.popped and nxt.loop is not None:
                    self._go_on(nxt, np.array([n], dtype=np.int64), walk)  # a skip over a loop, or NumPy
                elif chi - clo <= FEW:
                    work.append((nxt, range(clo, chi)))
                else:
                    if nxt.luts is None:
                        self.groups.luts_of(nxt)
                    if nxt.points is None:
                        self._go_on(nxt, np.array([n], dtype=np.int64), walk)  # many children: NumPy
                    else:  # a few code points (a literal): their children found by bisection
                        kids = []
                        for ci in nxt.points:
                            k = bisect_left(cpi, ci, clo, chi)
                            if k < chi and cpi[k] == ci:
                                kids.append(k)
                        work.append((nxt, kids))

    def _skip(self, group: Group, loop: Loop, nodes: np.ndarray | None, walk: Walk, arrived: np.ndarray | None,
              top: int | None = None) -> bool:
        """The tokens below ``nodes`` in a group that loops (``MaskGroups.block``): those whose further code points
        all stay in the loop are allowed, as a block; the walk goes on from the first node on each path that leaves
        it. True when the block also took the tokens ending at ``arrived`` (their partial characters checked
        against this group, as ``_arrive`` would). With ``top``, the nodes are the first ones of the character set
        there, all arrived: that block is made once (``MaskGroups.root_block``)."""
        tr = self.trie
        block = self.groups.block(loop, nodes, arrived) if top is None else self.groups.root_block(top, loop)
        if loop.tails_ok is None:  # ending inside a character: the loop's character sets must complete it
            loop.tails_ok = self.groups.partial_ok(group, tr.ptail)
        walk.blocks.append((block.starts, block.stops, tr.ptail[block.inside & ~loop.tails_ok]))
        if len(block.sel):
            walk.queue(group, loop.nodes[block.sel])
        return block.took

    def _to_ids(self, walk: Walk, extra: np.ndarray | None) -> np.ndarray:
        """What a walk accepted (positions, and blocks: sorted ranges of positions less some) as a dense mask over
        the vocabulary, or as token ids when few."""
        tr, n = self.trie, self.table.n
        parts = [a for a in walk.accepted if len(a)]
        count = sum(len(p) for p in parts)
        if walk.blocks and (count + sum(int((b[1] - b[0]).sum()) for b in walk.blocks)) * 32 <= n:
            for starts, stops, out_pos in walk.blocks:  # small blocks: as positions
                pos = ranges(starts, stops)
                if len(out_pos):
                    keep = np.ones(len(pos), dtype=bool)
                    keep[np.searchsorted(pos, out_pos)] = False
                    pos = pos[keep]
                parts.append(pos)
            walk.blocks = []
            count = sum(len(p) for p in parts)
        if not walk.blocks and count * 32 <= n:
            ids = tr.sorted_ids[np.concatenate(parts)] if parts else np.zeros(0, dtype=np.int64)
            return ids if extra is None or not len(extra) else np.concatenate([ids, extra])
        if len(walk.blocks) == 1 and tr.m - int((walk.blocks[0][1] - walk.blocks[0][0]).sum()) <= tr.m // 4:
            # one block of most tokens: every token of the tree, less the few outside the block
            starts, stops, out_pos = walk.blocks[0]
            out = tr.in_tree.copy()
            gaps = ranges(np.concatenate([[0], stops]), np.concatenate([starts, [tr.m]]))
            out[tr.sorted_ids[gaps]] = False
            out[tr.sorted_ids[out_pos]] = False
        else:
            by_pos = np.zeros(tr.m + 1, dtype=bool)  # the last entry, False, for the tokens outside the tree
            for starts, stops, out_pos in walk.blocks:
                block = cover(starts, stops, tr.m + 1)
                block[out_pos] = False
                by_pos |= block
            out = by_pos[tr.pos_of]
        if parts:
            out[tr.sorted_ids[np.concatenate(parts)]] = True
        if extra is not None:
            out[extra] = True
        return out
