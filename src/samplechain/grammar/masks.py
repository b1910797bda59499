"""Allowed-token masks of a grammar's states over a vocabulary, apart from the matcher: the vectorised
walk over every token's code points at once (NumPy).

Token masks are computed column by column over the whole vocabulary at once: all tokens start in the
state's stack set; at column j every group of tokens that share a stack set is split by which character sets
their j-th code point matches, and moves on to the union of the matching stacks' successors. Tokens that run
out of code points while some stack is alive are allowed. The work is shared by every token with the same
prefix class, so a mask costs about one pass over the vocabulary's code points, and a state's mask is
computed once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from samplechain.grammar.engine import _CHARSET, Grammar, Stack, State, check_budget
from samplechain.grammar.parser import TOKEN, TOKEN_NOT
from samplechain.grammar.tokens import TokenTable


def _top_bits(live: list[Stack]) -> dict[int, int]:
    """A bit per distinct top position of ``live`` (stacks with the same top match the same code points)."""
    bits: dict[int, int] = {}
    for s in live:
        bits.setdefault(s[-1], len(bits))
    return bits


class _Local:
    """The walk of one stack suffix over a token set: tokens it decides alone, and those that pop out."""

    __slots__ = ("accepted", "pops")

    def __init__(self, accepted: np.ndarray, pops: list[tuple[np.ndarray, np.ndarray]]) -> None:
        dense = accepted.sum() * 32 > len(accepted)
        self.accepted = accepted if dense else np.flatnonzero(accepted).astype(np.int32)
        self.pops = pops  # (token ids, their columns): the suffix was popped with these tokens unfinished

    def mark(self, allowed: np.ndarray) -> None:
        if self.accepted.dtype == bool:
            allowed |= self.accepted
        else:
            allowed[self.accepted] = True


LOCAL_DEPTH = 3  # stack entries in a cached suffix: enough to hold a string's or a number's whole rule
LOOP_MIN = 2048  # tokens in one self-looping stack set worth an index of where each token leaves the loop


class MaskEngine:
    """Allowed-token masks of a grammar's states over one vocabulary.

    A state's mask is the union of its stacks' masks. A stack's mask is the cached walk of its top
    ``LOCAL_DEPTH`` entries (context-independent: the same for a string wherever it occurs) plus the few
    tokens that pop out of that suffix, finished against the rest of the stack (context-dependent).
    State masks are cached (LRU, bounded in bytes).
    """

    def __init__(self, grammar: Grammar, table: TokenTable, cache_bytes: int = 64 << 20) -> None:
        self.grammar = grammar
        self.table = table
        self._cache: OrderedDict[State, np.ndarray] = OrderedDict()
        self._local: OrderedDict[Stack, _Local] = OrderedDict()
        self._cache_max = max(4, cache_bytes // max(1, table.n))
        self._union: dict = {}
        self._loops: dict[frozenset, np.ndarray | None] = {}
        self._luts: dict[int, np.ndarray] = {}
        self._eog = frozenset(table.eog.tolist())

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
                self._stack_into(s, None, tt.usable_ids, None, allowed)
        return allowed

    def _stack_into(self, s: Stack, source: tuple | None, ids: np.ndarray, cols: np.ndarray | None,
                    allowed: np.ndarray) -> None:
        """Mark the tokens ``ids`` (each from its column in ``cols``) that stack ``s`` takes.

        The walk of the top ``LOCAL_DEPTH`` entries is cached by (suffix, ``source``: what names the token
        set); tokens that pop out of it continue, from where they popped, through each stack below.
        """
        suffix = s[-LOCAL_DEPTH:]
        key = (suffix, source)
        local = self._local.get(key)
        if local is None:
            local = self._local[key] = self._local_walk(suffix, ids, cols)
            if len(self._local) > self._cache_max:
                self._local.popitem(last=False)
        else:
            self._local.move_to_end(key)
        local.mark(allowed)
        if len(s) > LOCAL_DEPTH and local.pops:
            types = self.grammar.types
            rest = self.grammar.advance(s[:-LOCAL_DEPTH])
            for i, (sub, sub_cols) in enumerate(local.pops):
                for r in rest:  # empty and token-topped stacks refuse unfinished text
                    if r and types[r[-1]] in _CHARSET:
                        self._stack_into(r, (key, i), sub, sub_cols, allowed)

    def _local_walk(self, suffix: Stack, ids: np.ndarray, cols: np.ndarray | None) -> _Local:
        tt = self.table
        accepted = np.zeros(tt.n, dtype=bool)
        pops: list[tuple[np.ndarray, np.ndarray]] = []
        if cols is None:  # the whole vocabulary from column 0: decide column 0 by distinct first character
            if len(tt.partial_only):
                ok = self._partial_ok((suffix,), tt.partial_only)
                accepted[tt.partial_only[ok]] = True
            first = tt.first_ids[np.repeat(self._lut(suffix[-1])[tt.first_cps], tt.first_counts)]
            nxt = self.grammar.step(suffix)
            self._walk({frozenset(nxt): (nxt, [first], [np.ones(len(first), dtype=np.int64)])}, accepted, pops)
        else:
            self._walk({frozenset((suffix,)): ((suffix,), [ids], [cols])}, accepted, pops)
        return _Local(accepted, pops)

    def _partial_ok(self, cfg: tuple[Stack, ...], ids: np.ndarray) -> np.ndarray:
        """For tokens that end inside a UTF-8 sequence: can a live character set of ``cfg`` complete it?"""
        tt, g = self.table, self.grammar
        low, high = tt.partial_low[ids], tt.partial_high[ids]
        ok = np.zeros(len(ids), dtype=bool)
        for top in {s[-1] for s in cfg if s and g.types[s[-1]] in _CHARSET}:
            ok |= g.charsets[top].can_complete_many(low, high)
        return ok

    def _walk(self, groups: dict, allowed: np.ndarray, pops: list | None) -> None:
        """Advance groups of tokens code point by code point; mark the allowed ones.

        ``groups`` maps a stack set to (its stacks, token id arrays, column arrays). With ``pops`` (a local
        walk) the empty stack means "popped out of the suffix": unfinished tokens there are recorded.
        """
        g, tt = self.grammar, self.table
        types = g.types
        flat, offsets, lens = tt.flat, tt.offsets, tt.lens
        while groups:
            nxt: dict = {}
            check_budget()
            for key, (cfg, id_parts, col_parts) in groups.items():
                ids = id_parts[0] if len(id_parts) == 1 else np.concatenate(id_parts)
                cols = col_parts[0] if len(col_parts) == 1 else np.concatenate(col_parts)
                pos = offsets[ids] + cols
                if len(ids) >= LOOP_MIN:
                    leave = self._loop_exits(key, cfg)
                    if leave is not None:  # jump over the code points that keep this stack set as it is
                        pos = np.minimum(leave[np.searchsorted(leave, pos)], offsets[ids] + lens[ids])
                        cols = pos - offsets[ids]
                popped = pops is not None and () in key
                ended = lens[ids] == cols
                if ended.any():
                    done = ids[ended]
                    pn = tt.partial_n[done]
                    allowed[done[pn == 0]] = True
                    pending = done[pn != 0]
                    if len(pending):
                        ok = self._partial_ok(cfg, pending)
                        allowed[pending[ok]] = True
                        if popped and not ok.all():
                            pops.append((pending[~ok], cols[ended][pn != 0][~ok]))
                    keep = ~ended
                    ids, cols, pos = ids[keep], cols[keep], pos[keep]
                if not len(ids):
                    continue
                if popped:
                    pops.append((ids, cols))
                live = [s for s in cfg if s and types[s[-1]] in _CHARSET]
                if not live:
                    continue
                cps = flat[pos]
                cols = cols + 1
                tops = _top_bits(live)
                if len(tops) == 1:
                    hit = self._lut(live[0][-1])[cps]
                    self._emit(nxt, key, live, 1, ids[hit], cols[hit])
                    continue
                code = np.zeros(len(ids), dtype=np.int64)
                for top, bit in tops.items():
                    code |= self._lut(top)[cps].astype(np.int64) << bit
                present = np.flatnonzero(np.bincount(code)) if len(tops) <= 16 else np.unique(code)
                for c in present.tolist():
                    if c:
                        sel = slice(None) if len(present) == 1 else code == c
                        self._emit(nxt, key, [s for s in live if c >> tops[s[-1]] & 1], c, ids[sel], cols[sel])
            groups = nxt

    def _lut(self, top: int) -> np.ndarray:
        lut = self._luts.get(top)
        if lut is None:
            lut = self._luts[top] = self.grammar.charsets[top].lut(self.table.lut_size)
        return lut

    def _union_of(self, key: frozenset, live: list[Stack], code: int) -> tuple[frozenset, tuple[Stack, ...]]:
        ukey = (key, code)
        union = self._union.get(ukey)
        if union is None:
            out: list[Stack] = []
            for s in live:
                for t in self.grammar.step(s):
                    if t not in out:
                        out.append(t)
            union = (frozenset(out), tuple(out))
            if len(self._union) > 100_000:
                self._union.clear()
            self._union[ukey] = union
        return union

    def _emit(self, nxt: dict, key: frozenset, live: list[Stack], code: int, ids: np.ndarray,
              cols: np.ndarray) -> None:
        if not len(ids):
            return
        ukey, stacks = self._union_of(key, live, code)
        entry = nxt.get(ukey)
        if entry is None:
            nxt[ukey] = (stacks, [ids], [cols])
        else:
            entry[1].append(ids)
            entry[2].append(cols)

    def _loop_exits(self, key: frozenset, cfg: tuple[Stack, ...]) -> np.ndarray | None:
        """For a stack set that some code points map back to itself: the sorted positions (in the vocabulary's
        code points) of the code points that leave it, ending with a sentinel. None: the set does not loop."""
        if key in self._loops:
            return self._loops[key]
        g, tt = self.grammar, self.table
        live = [s for s in cfg if s and g.types[s[-1]] in _CHARSET]
        tops = _top_bits(live)
        leave = None
        # a loop needs some top whose own successors are this very set (cheap test before any big array)
        if 0 < len(tops) <= 16 and any(
            self._union_of(key, [s for s in live if s[-1] == top], 1 << bit)[0] == key for top, bit in tops.items()
        ):
            code = np.zeros(tt.lut_size, dtype=np.int64)  # per code point value, which tops match it
            for top, bit in tops.items():
                code |= self._lut(top).astype(np.int64) << bit
            loops = [c for c in np.flatnonzero(np.bincount(code)).tolist()
                     if c and self._union_of(key, [s for s in live if c >> tops[s[-1]] & 1], c)[0] == key]
            if loops:
                stay = np.isin(code, loops)[tt.flat]
                leave = np.append(np.flatnonzero(~stay), len(stay))
        if len(self._loops) > 256:
            self._loops.clear()
        self._loops[key] = leave
        return leave
