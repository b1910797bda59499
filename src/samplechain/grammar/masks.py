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

This module holds the engine: state masks and their cache, and each stack's suffix walked once and continued
through the rest of the stack. The walk itself is ``mask_walk.py``; the groups and the character sets' tables over
the tree are ``mask_groups.py``; the range arithmetic over tree positions is ``tree_ranges.py``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from samplechain.grammar.engine import CHARSET, Grammar, Stack, State
from samplechain.grammar.mask_groups import MaskGroups
from samplechain.grammar.mask_walk import Deeper, Local, MaskWalker
from samplechain.grammar.parser import TOKEN, TOKEN_NOT
from samplechain.grammar.tokens import TokenTable


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
        self._walker = MaskWalker(MaskGroups(grammar, table))  # the groups' tables: part of compile time
        self._cache: OrderedDict[State, np.ndarray] = OrderedDict()
        self._local: OrderedDict[tuple, Local] = OrderedDict()
        self._cache_max = max(4, cache_bytes // max(1, table.n))
        self._local_bytes, self._local_max = 0, cache_bytes  # walks are mostly small: bounded by their bytes
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
            if s and types[s[-1]] in CHARSET:
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
                local = self._walker.walk_suffix(suffix, parents, depth < len(s))
            except Deeper:
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
                if r and types[r[-1]] in CHARSET:
                    if r[-1] == s[-1] and self._depths.get(r[-1], 1) <= depth:
                        self._depths[r[-1]] = depth + 1  # the rule repeats itself from below: walk more of it
                    self._stack_into(r, key, local.pops, allowed)
