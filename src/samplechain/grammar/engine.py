"""The grammar engine: compiled rules, parse stacks, matching, and token masks over a vocabulary.

A parse state is a set of *stacks* (spec/grammar §3.1); a stack is a tuple of element positions (bottom ->
top), each an index into one flat element array, so a stack is hashable and cheap. States are interned per
grammar, and everything that depends only on a stack (expansion, the stacks after its top character set
matched) or only on a state (each token's successor, the allowed-token mask) is computed once and cached.

Token masks are computed column by column over the whole vocabulary at once (NumPy): all tokens start in the
state's stack set; at column j every group of tokens that share a stack set is split by which character sets
their j-th code point matches, and moves on to the union of the matching stacks' successors. Tokens that run
out of code points while some stack is alive are allowed. The work is shared by every token with the same
prefix class, so a mask costs about one pass over the vocabulary's code points, and a state's mask is
computed once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from samplechain.grammar.parser import (
    ALT,
    CHAR,
    CHAR_ALT,
    CHAR_ANY,
    CHAR_NOT,
    CHAR_RNG_UPPER,
    END,
    RULE_REF,
    TOKEN,
    TOKEN_NOT,
    Element,
    GrammarError,
    ParsedGrammar,
    parse_gbnf,
)
from samplechain.grammar.utf8 import INVALID, NO_PARTIAL, Partial, decode, partial_range

Stack = tuple[int, ...]
MAX_STACKS = 100_000  # a state with more live parses than this is refused (ambiguity explosion)
_CHARSET = (CHAR, CHAR_NOT, CHAR_ANY)
_TOKENS = (TOKEN, TOKEN_NOT)
_budget = threading.local()


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Grammar work on this thread (expanding stacks, computing masks) raises ``GrammarError`` once it has taken
    more than ``seconds``: a server compiles a request's grammar and its first mask under a budget, so that no
    grammar can hold a worker for long. Other threads (the engine's) are not limited."""
    _budget.deadline, _budget.seconds = time.monotonic() + seconds, seconds
    try:
        yield
    finally:
        _budget.deadline = None


def check_budget() -> None:
    """Raise ``GrammarError`` when this thread's ``time_budget`` is spent."""
    deadline = getattr(_budget, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise GrammarError(f"the grammar took more than the compile time budget of {_budget.seconds:g} s; "
                           "simplify it (fewer alternatives or rules)")


class CharSet:
    """One character-set element run: sorted disjoint inclusive intervals, negated or not."""

    __slots__ = ("any", "ends", "intervals", "negated", "next", "starts")

    def __init__(self, intervals: list[tuple[int, int]], negated: bool, any_char: bool, next_pos: int) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(iv for iv in intervals if iv[0] <= iv[1]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.intervals = tuple((lo, hi) for lo, hi in merged)
        self.negated = negated
        self.any = any_char
        self.next = next_pos
        self.starts = np.array([lo for lo, _ in merged], dtype=np.int64)
        self.ends = np.array([hi for _, hi in merged], dtype=np.int64)

    def __contains__(self, cp: int) -> bool:
        if self.any:
            return True
        for lo, hi in self.intervals:
            if cp < lo:
                break
            if cp <= hi:
                return not self.negated
        return self.negated

    def match(self, cps: np.ndarray) -> np.ndarray:
        """Vectorised membership of an array of code points."""
        if self.any:
            return np.ones(cps.shape, dtype=bool)
        if len(self.starts) == 1:
            hit = (cps >= self.starts[0]) & (cps <= self.ends[0])
        else:
            i = np.searchsorted(self.starts, cps, side="right") - 1
            hit = (i >= 0) & (cps <= self.ends[np.maximum(i, 0)])
        return ~hit if self.negated else hit

    def lut(self, size: int) -> np.ndarray:
        """Membership of every code point below ``size`` as a lookup table."""
        table = np.zeros(size, dtype=bool)
        if self.any:
            table[:] = True
            return table
        for lo, hi in self.intervals:
            if lo < size:
                table[lo : min(hi, size - 1) + 1] = True
        return ~table if self.negated else table

    def can_complete(self, partial: Partial) -> bool:
        """Whether a pending partial UTF-8 sequence can still complete to a member (llama.cpp's partial match)."""
        rng = partial_range(partial)
        if rng is None:
            return False
        if self.any:
            return True
        low, high = rng
        hit = any(lo <= high and low <= hi for lo, hi in self.intervals)
        return not hit if self.negated else hit

    def can_complete_many(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """:meth:`can_complete` for arrays of completion ranges (``low`` -1: cannot complete)."""
        valid = low >= 0
        if self.any:
            return valid
        i = np.searchsorted(self.ends, low)  # first interval ending at or after low
        hit = (i < len(self.ends)) & (self.starts[np.minimum(i, len(self.starts) - 1)] <= high)
        return valid & (~hit if self.negated else hit)


class State:
    """An interned parse state: the live stacks (in llama.cpp's order) and the pending partial UTF-8."""

    __slots__ = ("accepting", "next", "partial", "stacks")

    def __init__(self, stacks: tuple[Stack, ...], partial: Partial) -> None:
        self.stacks = stacks
        self.partial = partial
        self.accepting = partial[1] == 0 and () in stacks
        self.next: dict = {}  # (token id, piece) -> State | None


class Grammar:
    """A compiled grammar: llama.cpp's rule tables plus the caches shared by all its matchers."""

    def __init__(self, parsed: ParsedGrammar, root: str = "root") -> None:
        if root not in parsed.symbol_ids:
            raise GrammarError(f"grammar does not contain a '{root}' symbol")
        self.parsed = parsed
        self.rules = parsed.rules
        self.symbol_ids = parsed.symbol_ids
        self.root = root
        self.root_id = parsed.symbol_ids[root]
        _check_left_recursion(parsed)
        self.types: list[int] = []
        self.values: list[int] = []
        self.rule_start: list[int] = []
        for rule in self.rules:
            self.rule_start.append(len(self.types))
            for t, v in rule:
                self.types.append(t)
                self.values.append(v)
        self.charsets: dict[int, CharSet] = {}
        for pos, t in enumerate(self.types):
            if t in _CHARSET:
                self.charsets[pos] = self._charset(pos)
        self._advance: dict[Stack, tuple[Stack, ...]] = {}
        self._step: dict[Stack, tuple[Stack, ...]] = {}
        self._states: dict[tuple[frozenset, Partial], State] = {}
        self.initial = self.state(self._initial_stacks(), NO_PARTIAL)

    @classmethod
    def from_gbnf(cls, text: str, root: str = "root", vocab: object = None) -> Grammar:
        """Parse and compile GBNF; ``vocab`` (a :class:`~samplechain.Vocab`) resolves ``<text>`` token items."""
        tokenize = None if vocab is None else (lambda s: vocab.tokenize(s, parse_special=True))
        return cls(parse_gbnf(text, tokenize), root)

    def matcher(self) -> GrammarMatcher:
        """An independent parse state at the start of the grammar."""
        return GrammarMatcher(self)

    # --- construction -------------------------------------------------------------------------------------

    def _charset(self, pos: int) -> CharSet:
        types, values = self.types, self.values
        negated = types[pos] == CHAR_NOT
        any_char = False
        intervals: list[tuple[int, int]] = []
        while True:
            if types[pos + 1] == CHAR_RNG_UPPER:
                intervals.append((values[pos], values[pos + 1]))
                pos += 2
            elif types[pos] == CHAR_ANY:
                any_char = True
                pos += 1
            else:
                intervals.append((values[pos], values[pos]))
                pos += 1
            if types[pos] != CHAR_ALT:
                return CharSet(intervals, negated, any_char, pos)

    def _end(self, pos: int) -> bool:
        return self.types[pos] in (END, ALT)

    def _initial_stacks(self) -> tuple[Stack, ...]:
        out: list[Stack] = []
        pos = self.rule_start[self.root_id]
        while True:
            for s in self.advance((pos,) if not self._end(pos) else ()):
                if s not in out:
                    out.append(s)
            while not self._end(pos):
                pos += 1
            if self.types[pos] != ALT:
                return tuple(out)
            pos += 1

    def _then(self, stack: Stack, nxt: int) -> Stack:
        """``stack`` with its top replaced by position ``nxt``, or popped when ``nxt`` ends the alternative."""
        return stack[:-1] if self._end(nxt) else (*stack[:-1], nxt)

    # --- stacks -------------------------------------------------------------------------------------------

    def advance(self, stack: Stack) -> tuple[Stack, ...]:
        """Every terminal-topped (or empty) stack reachable from ``stack`` without input (spec §3.2)."""
        done = self._advance.get(stack)
        if done is None:
            done = self._advance[stack] = self._expand(stack)
        return done

    def _expand(self, stack: Stack) -> tuple[Stack, ...]:
        """llama.cpp's advance_stack: a LIFO work list, alternatives in definition order, results in pop order."""
        types, values, rule_start = self.types, self.values, self.rule_start
        out: list[Stack] = []
        todo = [stack]
        seen: set[Stack] = set()
        check_budget()
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            if not s or types[s[-1]] != RULE_REF:
                out.append(s)  # seen already keeps duplicates out
                if len(out) > MAX_STACKS:
                    raise GrammarError(f"the grammar has more than {MAX_STACKS} simultaneous parses here; "
                                       "rewrite ambiguous repetitions (e.g. x? x? x? as x{0,3})")
                continue
            pos = s[-1]
            base = self._then(s, pos + 1)
            sub = rule_start[values[pos]]
            while True:
                todo.append(base if self._end(sub) else (*base, sub))
                while not self._end(sub):
                    sub += 1
                if types[sub] != ALT:
                    break
                sub += 1
        return tuple(out)

    def step(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks after the character set on top of ``stack`` matched one code point."""
        done = self._step.get(stack)
        if done is None:
            done = self._step[stack] = self.advance(self._then(stack, self.charsets[stack[-1]].next))
        return done

    def after_token(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks after the token element on top of ``stack`` matched."""
        return self.advance(self._then(stack, stack[-1] + 1))

    def token_matches(self, pos: int, token: int) -> bool:
        return (self.values[pos] == token) == (self.types[pos] == TOKEN)

    def state(self, stacks: Iterable[Stack], partial: Partial) -> State:
        stacks = tuple(stacks)
        key = (frozenset(stacks), partial)
        s = self._states.get(key)
        if s is None:
            if len(self._states) > 200_000:  # keep memory bounded on endless inputs; states stay valid
                self._states.clear()
                self._advance.clear()
                self._step.clear()
            s = self._states[key] = State(stacks, partial)
        return s

    # --- matching -----------------------------------------------------------------------------------------

    def feed_code_points(self, stacks: Iterable[Stack], cps: Iterable[int]) -> list[Stack]:
        """The stacks after consuming ``cps`` (token-topped and empty stacks die on a code point)."""
        cur = list(stacks)
        charsets, types = self.charsets, self.types
        for cp in cps:
            nxt: list[Stack] = []
            for s in cur:
                if s and types[s[-1]] in _CHARSET and cp in charsets[s[-1]]:
                    for t in self.step(s):
                        if t not in nxt:
                            nxt.append(t)
            cur = nxt
            if not cur:
                break
        return cur

    def transition(self, state: State, token: int, piece: bytes) -> State | None:
        """The state after accepting a token (id + text), or None when the grammar refuses it (spec §3.4).

        A token whose text ends inside a UTF-8 sequence is refused unless some live character set can still
        be completed by it; the same rule decides the mask, so ``transition`` and masks always agree.
        """
        key = (token, piece)
        nxt = state.next.get(key, False)
        if nxt is not False:
            return nxt
        cps, partial = decode(piece, state.partial)
        by_text: list[Stack] = []
        by_id: list[Stack] = []
        types = self.types
        text_ok = partial != INVALID and piece[:1] not in (b"", b"\0") and (cps or partial[1] > 0)
        for s in state.stacks:
            if not s:
                continue
            if types[s[-1]] in _TOKENS:  # a token element looks at the id only, never at the text
                found, out = (self.after_token(s) if self.token_matches(s[-1], token) else ()), by_id
            elif text_ok:
                found, out = self.feed_code_points((s,), cps), by_text
            else:
                continue
            for t in found:
                if t not in out:
                    out.append(t)
        if by_text:
            out = by_text + [t for t in by_id if t not in by_text]
            if partial[1] > 0:
                out = [s for s in out if s and types[s[-1]] in _CHARSET and self.charsets[s[-1]].can_complete(partial)]
        else:
            out, partial = by_id, NO_PARTIAL
        nxt = self.state(out, partial) if out else None
        if len(state.next) < 65536:
            state.next[key] = nxt
        return nxt


class GrammarMatcher:
    """Incremental parse state over a :class:`Grammar` (what llama.cpp calls the grammar's stacks)."""

    def __init__(self, grammar: Grammar, state: State | None = None) -> None:
        self.grammar = grammar
        self.state = grammar.initial if state is None else state

    @property
    def stacks(self) -> tuple[Stack, ...]:
        return self.state.stacks

    def accept_str(self, text: str) -> bool:
        """Feed ``text`` code point by code point; False (state unchanged) as soon as one is refused."""
        stacks = self.grammar.feed_code_points(self.state.stacks, map(ord, text))
        if not stacks:
            return False
        self.state = self.grammar.state(stacks, self.state.partial)
        return True

    def accept_token(self, token_id: int, piece: bytes) -> bool:
        """Feed one token (its id for token elements, its text for character sets); False when refused."""
        if isinstance(piece, str):
            piece = piece.encode("utf-8")
        nxt = self.grammar.transition(self.state, int(token_id), bytes(piece))
        if nxt is None:
            return False
        self.state = nxt
        return True

    def is_accepting(self) -> bool:
        """The input so far is a complete sentence of the grammar."""
        return self.state.accepting

    def reset(self) -> None:
        self.state = self.grammar.initial

    def clone(self) -> GrammarMatcher:
        return GrammarMatcher(self.grammar, self.state)


def _check_left_recursion(parsed: ParsedGrammar) -> None:
    """Refuse left recursion: llama.cpp's check (spec §3.7), plus any left cycle that grows the stack.

    llama.cpp only treats rules with an empty alternative of their own as nullable, so recursion through an
    indirectly nullable rule escapes it and then expands forever (Q15). With the full nullable fixpoint, a
    left cycle is harmless only when every step is a tail call (the stack returns to an identical state,
    e.g. ``( [x]* )*``); a cycle that leaves a continuation behind grows without end and is refused.
    """
    rules, n = parsed.rules, len(parsed.rules)

    def alternatives(rule: list[Element]) -> list[list[Element]]:
        alts, cur = [], []
        for e in rule:
            if e[0] in (ALT, END):
                alts.append(cur)
                cur = []
            else:
                cur.append(e)
        return alts

    alts = [alternatives(r) for r in rules]
    for r in rules:
        for t, v in r:
            if t == RULE_REF and v >= n:
                raise GrammarError(f"rule reference #{v} does not exist")
    # llama.cpp's check ("may be empty" = has an empty alternative)
    may_be_empty = [any(not a for a in alts[i]) for i in range(n)]
    visited, in_progress = [False] * n, [False] * n

    def llama_detect(i: int) -> int | None:
        stack = [(i, 0, 0)]  # iterative DFS over (rule, alternative, element)
        in_progress[i] = True
        while stack:
            r, a, e = stack.pop()
            if a >= len(alts[r]):
                in_progress[r] = False
                visited[r] = True
                continue
            alt = alts[r][a]
            if e >= len(alt) or alt[e][0] != RULE_REF:
                stack.append((r, a + 1, 0))
                continue
            child = alt[e][1]
            resume = (r, a, e + 1) if may_be_empty[child] else (r, a + 1, 0)
            if in_progress[child]:
                return child
            stack.append(resume)
            if not visited[child]:
                in_progress[child] = True
                stack.append((child, 0, 0))
        return None

    for i in range(n):
        if not visited[i] and (hit := llama_detect(i)) is not None:
            raise GrammarError(f"left recursion detected in rule '{parsed.name_of(hit)}'")
    # full nullable fixpoint, then left edges labelled "grows" when a continuation stays on the stack
    nullable = [False] * n
    changed = True
    while changed:
        changed = False
        for i in range(n):
            if not nullable[i] and any(all(t == RULE_REF and nullable[v] for t, v in a) for a in alts[i]):
                nullable[i] = changed = True
    edges: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for i in range(n):
        for a in alts[i]:
            for k, (t, v) in enumerate(a):
                if t != RULE_REF:
                    break
                edges[i].append((v, k + 1 < len(a)))
                if not nullable[v]:
                    break
    comp = _strongly_connected(n, [[v for v, _ in es] for es in edges])
    for i in range(n):
        for v, grows in edges[i]:
            if grows and comp[v] == comp[i]:
                raise GrammarError(f"left recursion detected in rule '{parsed.name_of(i)}'")


def _strongly_connected(n: int, adj: list[list[int]]) -> list[int]:
    """Component id of every node (iterative Tarjan)."""
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = n_comp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp


class TokenTable:
    """A vocabulary's token texts as code points, for masks: ragged code points, lengths, trailing partials.

    ``pieces`` is each token's text as the grammar sees it. Control tokens (special, not end-of-generation) have
    none: only token items (``<[id]>``, ``<|name|>``, ``!<[id]>``) match them, never literals or character
    classes. (llama.cpp matches their rendered text, so ``<|im_start|>`` fits inside a JSON string;
    spec/runtime-notes "Grammar engines".) End-of-generation tokens keep their text but are never matched by
    text or by a token item: the sampler allows them exactly where the grammar can end (spec/grammar §3.5, §3.8).

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
