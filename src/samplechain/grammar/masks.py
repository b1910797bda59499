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
the loop, and the walk goes on from those. A group whose tops take a few code points (a literal) finds its nodes'
children with those code points by bisection, without testing the others.

This module holds the engine: state masks and their cache, and each stack's suffix walked once and continued
through the rest of the stack (the pops of a state's walks into one rest of a stack go on together). What the
first mask inside a string would walk the longest (the string's contents over almost every token, its opening
quote) is walked with the grammar, in its compile time. The walk itself is ``mask_walk.py``; the groups and the
character sets' tables over the tree are ``mask_groups.py``; the range arithmetic over tree positions is
``tree_ranges.py``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from samplechain.grammar.engine import CHARSET, Grammar, Stack, State, check_budget
from samplechain.grammar.mask_groups import MaskGroups
from samplechain.grammar.mask_walk import Deeper, Local, MaskWalker
from samplechain.grammar.parser import ALT, END, RULE_REF, TOKEN, TOKEN_NOT
from samplechain.grammar.tokens import TokenTable
from samplechain.grammar.tree_ranges import unique

LOOPS_MAX = 8  # repetitions over almost every character walked with the grammar, at most


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
        self._prepare_loops()

    def _prepare_loops(self) -> None:
        """Walk, with the grammar (part of its compile time), where a repetition over a set of almost every
        character starts (a JSON string's contents, ``char*``, with its escapes and its closing quote), and the
        first characters of the rules that hold one (the string's opening quote); at most ``LOOPS_MAX``
        repetitions. These walks are the costly ones of the first mask inside a string; made here on the bare
        stacks (the repetition's reference, and what follows it in its rule), they are found under the same keys
        by any stack that holds them, as ``_stack_into`` walks only a stack's top entries."""
        g, wide = self.grammar, self._walker.groups.wide
        if not wide:
            return
        types, values, starts = g.types, g.values, g.rule_start
        scratch = np.zeros(self.table.n, dtype=bool)
        pending: dict[Stack, list] = {}
        repeating = [self._repeats_itself(rule) for rule in range(len(starts))]
        walked = 0
        for start in starts:
            pos, alts, refs = start, [start], []
            while types[pos] != END:
                if types[pos] == ALT:
                    alts.append(pos + 1)
                elif types[pos] == RULE_REF and types[pos + 1] not in (END, ALT) and repeating[values[pos]]:
                    refs.append(pos)  # a repetition, and something after it
                pos += 1
            found = False
            for q in refs:
                if walked >= LOOPS_MAX:
                    break
                stacks = [s for s in g.advance((q,)) if s and types[s[-1]] in CHARSET]
                if any(s[-1] in wide for s in stacks):  # the repetition's contents, and what ends it
                    walked += 1
                    found = True
                    for s in stacks:
                        self._stack_into(s, None, None, scratch, pending)
                    self._continue(pending, scratch)
            if found:  # the rule's own first characters (a quote) lead into the repetition
                for a in alts:
                    if types[a] in CHARSET:
                        self._stack_into((a,), None, None, scratch, pending)

    def _repeats_itself(self, rule: int) -> bool:
        """Whether some alternative of ``rule`` ends with ``rule`` itself (a repetition, ``x*``)."""
        types, values = self.grammar.types, self.grammar.values
        pos = self.grammar.rule_start[rule]
        while types[pos] != END:
            if types[pos] == RULE_REF and values[pos] == rule and types[pos + 1] in (END, ALT):
                return True
            pos += 1
        return False

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
        pending: dict[Stack, list] = {}
        for s in state.stacks:
            if s and types[s[-1]] in CHARSET:
                self._stack_into(s, None, None, allowed, pending)
        self._continue(pending, allowed)
        return allowed

    def _stack_into(self, s: Stack, source: object, parents: np.ndarray | None, allowed: np.ndarray,
                    pending: dict[Stack, list]) -> None:
        """Mark the tokens that stack ``s`` takes: every token (``parents`` None), or those below the tree nodes
        ``parents``, whose code points so far the stacks above ``s`` consumed; queue on ``pending`` the tokens
        that pop out of the walked suffix with text left (for ``_continue``).

        Only the top entries of ``s`` are walked (its *suffix*); the walk is cached by (suffix, ``source``: what
        names the nodes), so that a suffix is walked once wherever it occurs (a string's contents, a run of
        whitespace). A suffix is as short as it can be: one entry, or more when one entry pops out at once with
        many tokens, or pops into the same top again (a repetition whose every step ends the rule: ``char*``);
        found once per top.
        """
        check_budget()  # a state may hold many stacks
        depth = self._depths.get(s[-1], 1)
        while True:
            suffix = s[-depth:]
            key = (suffix, source)
            local = self._local.get(key)
            if local is not None:
                self._local.move_to_end(key)
                break
            if depth < len(s) and self._repeats(s, depth):
                depth += 1
                self._depths[s[-1]] = depth
                continue
            try:
                local = self._walker.walk_suffix(suffix, parents, depth < len(s))
            except Deeper:
                depth += 1
                self._depths[s[-1]] = depth
                continue
            self._keep(key, local)
            break
        local.mark(allowed)
        if len(s) > depth and local.pops is not None:
            pending.setdefault(s[:-depth], []).append((key, local.pops))

    def _continue(self, pending: dict[Stack, list], allowed: np.ndarray) -> None:
        """Go on with the tokens that popped out of walked suffixes with text left: from the nodes where they
        popped, through each stack that the rest of their stack (the *base*) advances to. The longest base first,
        so that the pops into one base, from any walk, go on together (one walk per stack, cached by the
        suffix and the walks whose pops it goes on from)."""
        types = self.grammar.types
        while pending:
            base = max(pending, key=len)
            entries = pending.pop(base)
            if len(entries) == 1:
                source, parents = entries[0]
            else:
                source = frozenset(k for k, _ in entries)
                parents = unique(np.concatenate([p for _, p in entries]))
            for r in self.grammar.advance(base):  # empty and token-topped stacks refuse unfinished text
                if r and types[r[-1]] in CHARSET:
                    self._stack_into(r, source, parents, allowed, pending)

    def _keep(self, key: tuple, local: Local) -> None:
        self._local[key] = local
        self._local_bytes += local.nbytes()
        while self._local_bytes > self._local_max and len(self._local) > 1:
            self._local_bytes -= self._local.popitem(last=False)[1].nbytes()

    def _repeats(self, s: Stack, depth: int) -> bool:
        """Whether the suffix of ``s`` of ``depth`` entries, once done, comes back to the same top (a repetition such
        as ``char*``): walking one more entry then takes the loop in one walk."""
        top = s[-1]
        return any(r and r[-1] == top for r in self.grammar.advance(s[:-depth]))
