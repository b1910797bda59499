"""The grammar engine: compiled rules, parse stacks and matching (token masks live in ``masks.py``).

A parse state is a set of *stacks* (llama.cpp's ``llama_grammar_stacks``); a stack is a tuple of element
positions (bottom -> top), each an index into one flat element array, so a stack is hashable and cheap. States are
interned per grammar, and everything that depends only on a stack (expansion, the stacks after its top character set
matched) or only on a state (each token's successor, the allowed-token mask) is computed once and cached.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from samplechain.grammar.left_recursion import check_left_recursion
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
    GrammarError,
    ParsedGrammar,
    parse_gbnf,
)
from samplechain.grammar.utf8 import INVALID, NO_PARTIAL, Partial, decode, partial_range

Stack = tuple[int, ...]
MAX_STACKS = 100_000  # a state with more live parses than this is refused (ambiguity explosion)
CHARSET = (CHAR, CHAR_NOT, CHAR_ANY)
_TOKENS = (TOKEN, TOKEN_NOT)
_budget = threading.local()


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Grammar work on this thread (expanding stacks, computing masks) raises ``GrammarError`` once it has taken
    more than ``seconds`` of this thread's CPU time: a server compiles a request's grammar and its first mask under
    a budget, so that no grammar can hold a worker for long. CPU time, not wall time: the budget measures the
    grammar's work, so a busy machine (or other requests compiling beside it, sharing the GIL) never fails a grammar
    that fits. Other threads (the engine's) are not limited."""
    _budget.deadline, _budget.seconds = time.thread_time() + seconds, seconds
    try:
        yield
    finally:
        _budget.deadline = None


def check_budget() -> None:
    """Raise ``GrammarError`` when this thread's ``time_budget`` is spent."""
    deadline = getattr(_budget, "deadline", None)
    if deadline is not None and time.thread_time() > deadline:
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
        check_left_recursion(parsed)
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
            if t in CHARSET:
                self.charsets[pos] = self._charset(pos)
        self._ends = [t in (END, ALT) for t in self.types]  # the position ends an alternative
        self._alts: list[tuple[int, ...]] = []  # each rule's alternatives, as their first positions in order
        for start in self.rule_start:
            alts, pos = [start], start
            while self.types[pos] != END:
                if self.types[pos] == ALT:
                    alts.append(pos + 1)
                pos += 1
            self._alts.append(tuple(alts))
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
        return self._ends[pos]

    def _initial_stacks(self) -> tuple[Stack, ...]:
        out: list[Stack] = []
        seen: set[Stack] = set()
        pos = self.rule_start[self.root_id]
        while True:
            check_budget()
            for s in self.advance((pos,) if not self._end(pos) else ()):
                if s not in seen:
                    seen.add(s)
                    out.append(s)
            while not self._end(pos):
                pos += 1
            if self.types[pos] != ALT:
                return tuple(out)
            pos += 1

    def _then(self, stack: Stack, nxt: int) -> Stack:
        """``stack`` with its top replaced by position ``nxt``, or popped when ``nxt`` ends the alternative."""
        return stack[:-1] if self._ends[nxt] else (*stack[:-1], nxt)

    # --- stacks -------------------------------------------------------------------------------------------

    def advance(self, stack: Stack) -> tuple[Stack, ...]:
        """Every terminal-topped (or empty) stack reachable from ``stack`` without input (llama.cpp's
        ``llama_grammar_advance_stack``)."""
        done = self._advance.get(stack)
        if done is None:
            if not stack or self.types[stack[-1]] != RULE_REF:
                return (stack,)  # already terminal-topped (or empty): nothing to expand, nothing to keep
            done = self._advance[stack] = self._expand(stack)
        return done

    def _expand(self, stack: Stack) -> tuple[Stack, ...]:
        """llama.cpp's advance_stack: a LIFO work list, alternatives in definition order, results in pop order."""
        types, values, alts, ends = self.types, self.values, self._alts, self._ends
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
            base = s[:-1] if ends[pos + 1] else (*s[:-1], pos + 1)
            for sub in alts[values[pos]]:
                todo.append(base if ends[sub] else (*base, sub))
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
                if s and types[s[-1]] in CHARSET and cp in charsets[s[-1]]:
                    for t in self.step(s):
                        if t not in nxt:
                            nxt.append(t)
            cur = nxt
            if not cur:
                break
        return cur

    def transition(self, state: State, token: int, piece: bytes) -> State | None:
        """The state after accepting a token (id + text), or None when the grammar refuses it (llama.cpp's
        ``llama_grammar_accept_token``).

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
                out = [s for s in out if s and types[s[-1]] in CHARSET and self.charsets[s[-1]].can_complete(partial)]
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
