"""Reasoning budget: caps the tokens of a thinking block, then forces its end.

llama.cpp's ``common_reasoning_budget`` (common/reasoning-budget.cpp). A start sequence (``<think>``) opens a
block; after ``budget`` generated tokens inside it the sampler forces ``forced`` (a message and the end tag),
one token per step. States::

    IDLE --start--> COUNTING --end--------------------------------------------> DONE --start--> COUNTING ...
                       |--budget spent, text ends on a whole UTF-8 char--> FORCING --forced done--> DONE
                       '--budget spent mid-character--> WAITING_UTF8 --char complete--> FORCING
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from samplechain._numeric import F32, NEG_INF
from samplechain.candidates import Candidates
from samplechain.samplers.base import FILTER, Sampler
from samplechain.validate import check_int

if TYPE_CHECKING:
    from samplechain.vocab import Vocab

INT32_MAX = 2**31 - 1


class ReasoningBudgetState(IntEnum):
    """llama.cpp's ``common_reasoning_budget_state`` (same values)."""

    IDLE = 0  # waiting for a start sequence
    COUNTING = 1  # inside a block, counting its tokens down
    FORCING = 2  # forcing the forced sequence, one token per step
    WAITING_UTF8 = 3  # budget spent; waiting for the text to end on a whole UTF-8 character
    DONE = 4  # passthrough until a new start sequence re-arms it


def utf8_is_complete(data: bytes) -> bool:
    """Whether ``data`` ends on a whole UTF-8 character (llama.cpp's ``common_utf8_is_complete``).

    Looks at the last non-continuation byte among the final four; all-continuation tails are incomplete.
    """
    n = len(data)
    if n == 0:
        return True
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if c & 0xC0 != 0x80:
            expected = 4 if c >= 0xF0 else 3 if c >= 0xE0 else 2 if c >= 0xC0 else 1
            return i >= expected
    return False


class _Automaton:
    """Aho-Corasick over token ids (llama.cpp's ``common_aho_corasick``); immutable once built.

    ``match[s]`` is the index of the longest pattern ending at state ``s`` (directly or via failure links).
    """

    __slots__ = ("children", "fail", "match")

    def __init__(self, patterns: Sequence[tuple[int, ...]]) -> None:
        children: list[dict[int, int]] = [{}]
        pattern = [-1]
        for index, seq in enumerate(patterns):
            s = 0
            for tok in seq:
                nxt = children[s].get(tok)
                if nxt is None:
                    nxt = len(children)
                    children[s][tok] = nxt
                    children.append({})
                    pattern.append(-1)
                s = nxt
            if pattern[s] < 0:  # duplicates keep the first index
                pattern[s] = index
        fail = [0] * len(children)
        match = list(pattern)
        queue = list(children[0].values())  # depth 1: failure link to the root
        for s in queue:  # breadth-first: a state's (shallower) failure target is settled before its children
            for tok, child in children[s].items():
                f = fail[s]
                while f and tok not in children[f]:
                    f = fail[f]
                fail[child] = children[f].get(tok, 0)
                if match[child] < 0:
                    match[child] = match[fail[child]]
                queue.append(child)
        self.children = children
        self.fail = fail
        self.match = match

    def next(self, state: int, token: int) -> int:
        children = self.children
        while state and token not in children[state]:
            state = self.fail[state]
        return children[state].get(token, 0)


class _Matcher:
    """Sequence matcher (llama.cpp's ``token_matcher``): the automaton is shared, the position is not."""

    __slots__ = ("automaton", "seqs", "state")

    def __init__(self, seqs: tuple[tuple[int, ...], ...], automaton: _Automaton) -> None:
        self.seqs = seqs
        self.automaton = automaton
        self.state = 0

    @classmethod
    def build(cls, seqs: Iterable[tuple[int, ...]]) -> _Matcher:
        unique: list[tuple[int, ...]] = []
        for seq in seqs:  # non-empty, first occurrence kept, order preserved
            if seq and seq not in unique:
                unique.append(seq)
        return cls(tuple(unique), _Automaton(unique))

    def advance(self, token: int) -> int:
        """Index into ``seqs`` of the longest sequence ending at ``token`` (the matcher restarts), else -1."""
        self.state = self.automaton.next(self.state, token)
        p = self.automaton.match[self.state]
        if p >= 0:
            self.state = 0
        return p

    def reset(self) -> None:
        self.state = 0

    def copy(self) -> _Matcher:
        other = _Matcher(self.seqs, self.automaton)
        other.state = self.state
        return other


def _token_seqs(name: str, value: object) -> tuple[tuple[int, ...], ...]:
    """Sequences of token ids from a list of sequences, or one flat list of ids (one sequence)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of token-id sequences, got {value!r}")
    items = list(value)
    if items and all(not isinstance(x, Iterable) for x in items):
        items = [items]  # a flat list of ids is one sequence
    out = []
    for seq in items:
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Iterable):
            raise ValueError(f"{name} must be a list of token-id sequences, got {seq!r}")
        out.append(_token_ids(name, seq))
    return tuple(out)


def _token_ids(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a sequence of token ids, got {value!r}")
    return tuple(check_int(f"{name} token", t, minimum=0) for t in value)


def _state(value: object) -> ReasoningBudgetState:
    if isinstance(value, str):
        try:
            return ReasoningBudgetState[value.upper()]
        except KeyError:
            pass
    elif not isinstance(value, bool):
        try:
            return ReasoningBudgetState(value)
        except ValueError:
            pass
    names = ", ".join(s.name for s in ReasoningBudgetState)
    raise ValueError(f"initial_state must be one of {names}, got {value!r}")


class ReasoningBudget(Sampler):
    """Limits a thinking block to ``budget`` tokens, then forces ``forced`` (llama.cpp's reasoning budget).

    ``start`` and ``end`` are token-id sequences (a list of sequences, or one flat list); duplicates and empty
    ones are dropped, and a sequence may span several tokens, matched across accepts. ``budget`` counts the
    accepted tokens inside a block (``0``: force at once). ``vocab`` (optional) lets the sampler wait for a
    whole UTF-8 character before forcing; without it every token counts as complete. ``initial_state``
    ``COUNTING`` starts inside a block (promoted to ``FORCING`` when ``budget`` is 0).

    While forcing, ``apply`` leaves only the next forced token finite; ``accept`` moves to the next forced
    token whatever token it is given (llama.cpp's behaviour).
    """

    name = "reasoning-budget"
    effect = FILTER

    def __init__(
        self,
        vocab: Vocab | None,
        start: Iterable[Iterable[int]] | Iterable[int],
        end: Iterable[Iterable[int]] | Iterable[int],
        forced: Iterable[int],
        budget: int,
        initial_state: ReasoningBudgetState | str | int = ReasoningBudgetState.IDLE,
    ) -> None:
        self.vocab = vocab
        n = None if vocab is None else vocab.n_tokens
        start_seqs = _token_seqs("start", start)
        end_seqs = _token_seqs("end", end)
        self.forced = _token_ids("forced", forced)
        if n is not None:
            for what, seqs in (("start", start_seqs), ("end", end_seqs), ("forced", (self.forced,))):
                bad = [t for seq in seqs for t in seq if t >= n]
                if bad:
                    raise ValueError(f"{what} token {bad[0]} is outside the vocabulary [0, {n})")
        self.budget = check_int("budget", budget, minimum=0)
        if self.budget > INT32_MAX:
            raise ValueError(f"budget must be at most {INT32_MAX}, got {self.budget}")
        state = _state(initial_state)
        if state == ReasoningBudgetState.COUNTING and self.budget <= 0:
            state = ReasoningBudgetState.FORCING
        self._start = _Matcher.build(start_seqs)
        self._end = _Matcher.build(end_seqs)
        self.initial_state = state
        self.state = state
        self.remaining = self.budget
        self.force_pos = 0
        self._end_match = -1

    def params(self) -> dict:
        return {"start": self.start, "end": self.end, "forced": self.forced, "budget": self.budget,
                "initial_state": self.initial_state.name}

    @property
    def start(self) -> tuple[tuple[int, ...], ...]:
        """The start sequences (deduplicated, non-empty)."""
        return self._start.seqs

    @property
    def end(self) -> tuple[tuple[int, ...], ...]:
        """The end sequences (deduplicated, non-empty)."""
        return self._end.seqs

    @property
    def end_match(self) -> tuple[int, ...] | None:
        """The end sequence that closed the last block (None if none did; cleared when a block re-opens)."""
        return None if self._end_match < 0 else self._end.seqs[self._end_match]

    # --- the state machine (common_reasoning_budget_accept) -------------------------------------------------

    def _open_block(self) -> None:
        self.state = ReasoningBudgetState.COUNTING
        self.remaining = self.budget
        self._end_match = -1
        if self.remaining <= 0:
            self.state = ReasoningBudgetState.FORCING
            self.force_pos = 0

    def _start_forcing(self) -> None:
        self.state = ReasoningBudgetState.FORCING
        self.force_pos = 0
        self._end.reset()

    def accept(self, token: int) -> None:
        token = int(token)
        S = ReasoningBudgetState
        state = self.state
        if state == S.IDLE:
            if self._start.advance(token) >= 0:
                self._open_block()
        elif state in (S.COUNTING, S.WAITING_UTF8):
            match = self._end.advance(token)
            if match >= 0:
                self.state = S.DONE
                self._end_match = match
                return
            complete = True
            if self.vocab is not None:
                if not 0 <= token < self.vocab.n_tokens:
                    raise ValueError(f"token {token} is outside the vocabulary [0, {self.vocab.n_tokens})")
                complete = utf8_is_complete(self.vocab.piece(token))
            if state == S.WAITING_UTF8:
                if complete:
                    self._start_forcing()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._start_forcing()
                    else:
                        self.state = S.WAITING_UTF8
                        self._end.reset()
        elif state == S.FORCING:
            # the end sequence inside the forced text is recorded too; the position advances whatever the token
            match = self._end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = S.DONE
                self._end_match = match
        elif state == S.DONE and self._start.advance(token) >= 0:  # a new block gets a fresh budget
            self._open_block()
            self._end.reset()

    def apply(self, c: Candidates) -> None:
        if self.state != ReasoningBudgetState.FORCING or self.force_pos >= len(self.forced):
            return
        keep = c.ids == self.forced[self.force_pos]
        c.set_logits(np.where(keep, c.logits, NEG_INF).astype(F32, copy=False))
        c.sorted = False

    def force(self) -> bool:
        """End the current block now: COUNTING -> FORCING from the first forced token. False (and no change)
        from any other state (llama.cpp's ``common_reasoning_budget_force``)."""
        if self.state != ReasoningBudgetState.COUNTING:
            return False
        self._start_forcing()
        return True

    def reset(self) -> None:
        """Back to IDLE with the counters cleared (llama.cpp resets to IDLE whatever the initial state)."""
        self.state = ReasoningBudgetState.IDLE
        self.remaining = self.budget
        self._start.reset()
        self._end.reset()
        self.force_pos = 0
        self._end_match = -1

    def clone(self) -> ReasoningBudget:
        other = ReasoningBudget.__new__(ReasoningBudget)
        other.__dict__.update(self.__dict__)
        other._start = self._start.copy()
        other._end = self._end.copy()
        return other
