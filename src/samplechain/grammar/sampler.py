"""The grammar sampler: masks the tokens a GBNF grammar refuses, follows accepted tokens, lazy triggers."""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from samplechain._numeric import F32
from samplechain.candidates import Candidates
from samplechain.grammar.engine import Grammar, State
from samplechain.grammar.masks import MaskEngine
from samplechain.grammar.parser import GrammarError
from samplechain.grammar.tokens import TokenTable
from samplechain.samplers.base import FILTER, Sampler
from samplechain.vocab import Vocab

SMALL_CANDIDATE_SET = 32  # up to this many candidates are checked one by one instead of taking a full mask
_LEADING_ANY = (b"[\\s\\S]*", b".*", b"(?s).*")


class _Trigger:
    """A compiled trigger pattern: byte regex (llama.cpp's std::regex runs over bytes, too)."""

    def __init__(self, source: str) -> None:
        if not isinstance(source, str):
            raise GrammarError(f"trigger patterns must be strings, got {type(source).__name__}")
        self.source = source
        raw = source.encode("utf-8")
        try:
            self.regex = re.compile(raw)
        except re.error as e:
            raise GrammarError(f"invalid trigger pattern {source!r}: {e}") from None
        self.anchored = source.startswith("^") and source.endswith("$")
        # a search for a pattern that may start anywhere equals a match at 0, and that avoids the quadratic
        # retry at every start position (the lazy-grammar buffer is searched again after every token)
        self.from_start = raw.startswith(_LEADING_ANY)

    def start(self, buffer: bytes) -> int | None:
        """Where the grammar's input starts: the first non-empty capture group of the match, or the match."""
        m = self.regex.fullmatch(buffer) if self.anchored else None
        if m is None:
            m = self.regex.match(buffer) if self.from_start else self.regex.search(buffer)
        if m is None:
            return None
        for i in range(1, (m.re.groups or 0) + 1):
            if m.start(i) >= 0 and m.end(i) > m.start(i):
                return m.start(i)
        return m.start()


class GrammarSampler(Sampler):
    """Constrains sampling to a GBNF grammar over ``vocab`` (llama.cpp's ``grammar`` sampler).

    An empty grammar text gives a sampler that constrains nothing (as llama.cpp). Tokens the grammar cannot
    take get ``-inf``; accepting one raises :class:`GrammarError` and leaves the state as it was. Control
    tokens are matched only by token items, never as text; end-of-generation tokens only where the grammar
    can end.
    """

    name = "grammar"
    effect = FILTER

    def __init__(self, vocab: Vocab, grammar: str | Grammar, root: str = "root") -> None:
        self._setup(vocab, grammar, root, lazy=False, patterns=(), tokens=())

    @classmethod
    def lazy(cls, vocab: Vocab, grammar: str | Grammar, root: str = "root",
             trigger_patterns: Iterable[str] = (), trigger_tokens: Iterable[int] = ()) -> GrammarSampler:
        """A grammar that stays off until a trigger: a token in ``trigger_tokens``, or generated text matching
        a pattern in ``trigger_patterns`` (the grammar then parses from the pattern's first capture group)."""
        self = cls.__new__(cls)
        self._setup(vocab, grammar, root, lazy=True, patterns=trigger_patterns, tokens=trigger_tokens)
        return self

    def _setup(self, vocab: Vocab, grammar: str | Grammar, root: str, lazy: bool, patterns: Iterable[str],
               tokens: Iterable[int]) -> None:
        if not isinstance(vocab, Vocab):
            raise ValueError(f"GrammarSampler needs a Vocab, got {type(vocab).__name__}")
        self.vocab = vocab
        self.source = grammar if isinstance(grammar, str) else None
        self.root = root
        if isinstance(grammar, Grammar):
            self.grammar: Grammar | None = grammar
        elif not isinstance(grammar, str):
            raise GrammarError(f"grammar must be GBNF text or a Grammar, got {type(grammar).__name__}")
        else:
            self.grammar = Grammar.from_gbnf(grammar, root, vocab) if grammar.strip() else None
        self.is_lazy = lazy
        if isinstance(patterns, str):
            patterns = (patterns,)
        self.trigger_patterns = [_Trigger(p) for p in patterns]
        self.trigger_tokens = frozenset(self._check_token(t) for t in tokens)
        self.engine = None if self.grammar is None else MaskEngine(self.grammar, TokenTable.of(vocab))
        self.disabled = self.grammar is None
        self.reset()

    def _check_token(self, token: object) -> int:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < self.vocab.n_tokens:
            raise GrammarError(f"trigger token {token!r} is not a token id in [0, {self.vocab.n_tokens})")
        return int(token)

    def params(self) -> dict:
        return {"grammar": self.source, "root": self.root, "lazy": self.is_lazy}

    # --- state --------------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.state: State | None = None if self.grammar is None else self.grammar.initial
        self.awaiting_trigger = self.is_lazy
        self._buffer = b""
        self._positions: list[tuple[int, int, int]] = []

    def clone(self) -> GrammarSampler:
        other = GrammarSampler.__new__(GrammarSampler)
        other.__dict__.update(self.__dict__)
        other._positions = list(self._positions)
        return other

    @property
    def active(self) -> bool:
        """Whether the grammar constrains the next token (it exists and is not awaiting a trigger)."""
        return self.grammar is not None and not self.awaiting_trigger

    def is_accepting(self) -> bool:
        return self.state is not None and self.state.accepting

    # --- masks --------------------------------------------------------------------------------------------

    def mask(self) -> np.ndarray | None:
        """The allowed tokens of the current state (bool array over the vocabulary); None when inactive."""
        return self.engine.mask(self.state) if self.active else None

    def mask_tensor(self, device: object = "cpu") -> object:
        """The mask as a torch bool tensor on ``device`` (for the device path); None when inactive."""
        import torch

        m = self.mask()
        return None if m is None else torch.from_numpy(m.copy()).to(device)

    def allows(self, token: int) -> bool:
        return not self.active or self.engine.allows(self.state, int(token))

    def apply(self, c: Candidates) -> None:
        if not self.active:
            return
        n = self.vocab.n_tokens
        if c.identity:
            if len(c) != n:
                raise ValueError(f"logits have {len(c)} entries but the grammar's vocabulary has {n} tokens")
            ok = self.engine.mask(self.state)
        else:
            ids = c.ids
            if len(ids) and int(ids.max()) >= n:
                raise ValueError(f"token {int(ids.max())} is outside the grammar's vocabulary [0, {n})")
            if len(ids) <= SMALL_CANDIDATE_SET:
                ok = np.fromiter((self.engine.allows(self.state, t) for t in ids.tolist()), dtype=bool,
                                 count=len(ids))
            else:
                ok = self.engine.mask(self.state)[ids]
        if not ok.all():
            c.set_logits(np.where(ok, c.logits, F32(-np.inf)).astype(F32, copy=False))
            c.sorted = False

    def accept(self, token: int) -> None:
        if self.grammar is None:
            return
        token = int(token)
        if self.awaiting_trigger:
            self._await(token)
            return
        if self.vocab.is_eog(token):
            if () not in self.state.stacks:
                raise GrammarError(f"end-of-generation token {token} while the grammar is incomplete")
            return
        self.state = self._feed(self.state, token, self.engine.table.pieces[token])

    def _feed(self, state: State, token: int, piece: bytes) -> State:
        """The state after ``token`` with ``piece``, its text as the grammar sees it (none for control tokens)."""
        nxt = self.grammar.transition(state, token, piece)
        if nxt is None:
            kind = "control token" if token in self.vocab.control else "token"
            raise GrammarError(f"the grammar refuses {kind} {token} ({self.vocab.token_bytes(token)!r}) here")
        return nxt

    def _await(self, token: int) -> None:
        """Lazy grammar, not triggered yet: watch for a trigger token or a trigger pattern (llama.cpp's
        ``llama_grammar_accept_impl`` while ``awaiting_trigger``).

        The buffer holds the tokens' rendered text (control tokens included: patterns may look for them); the
        grammar is fed only what it sees of each token (nothing of a control token: see ``TokenTable``).
        """
        piece = self.vocab.token_bytes(token)
        pieces = self.engine.table.pieces
        if token in self.trigger_tokens:
            self.state = self._feed(self.grammar.initial, token, pieces[token])
            self.awaiting_trigger = False
            self._buffer, self._positions = b"", []
            return
        start = len(self._buffer)
        self._buffer += piece
        self._positions.append((token, start, len(self._buffer)))
        for trigger in self.trigger_patterns:
            at = trigger.start(self._buffer)
            if at is None:
                continue
            state = self.grammar.initial
            for tok, lo, hi in self._positions:
                if hi > at:  # the token's text from the match start on (llama.cpp keeps the token's id)
                    state = self._feed(state, tok, pieces[tok][max(lo, at) - lo :])
            self.state = state
            self.awaiting_trigger = False
            self._buffer, self._positions = b"", []
            return
