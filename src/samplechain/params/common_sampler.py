"""``CommonSampler`` (llama.cpp's ``common/sampling.cpp``): the chain built from ``SamplingParams``, the history,
the grammar, the reasoning budget and the probabilities.

The chain ``CommonSampler`` builds (as ``common_sampler_init`` does):

1. ``logit-bias`` first, when any bias is set (user biases, then ``-inf`` for every EOG token with
   ``ignore_eos``);
2. with ``mirostat == 0``: one sampler per entry of ``samplers``, in order (default
   ``penalties; dry; top_n_sigma; top_k; typ_p; top_p; min_p; xtc; temperature``), then ``adaptive-p`` if
   ``adaptive_p`` appears in the list, else ``dist``; ``temperature`` is llama.cpp's ``temp_ext``;
3. with ``mirostat == 1`` or ``2``: ``temp`` then ``mirostat`` / ``mirostat-v2``; every other sampler is dropped;
4. samplers whose parameters make them no-ops are left out (``describe()`` shows what runs).

Outside the chain, as in llama.cpp's ``common_sampler_sample``: the reasoning budget (created when start and
end tags are set and ``reasoning_budget_tokens >= 0``, ``reasoning_control`` or ``grammar_lazy``) is applied
first, then the grammar (``grammar_first``) or the chain with the grammar checked by rejection. Both only see
generated tokens; a lazy grammar waits while a thinking block is open. :meth:`CommonSampler.stages` is that
order, written once; ``sample(..., observe=...)`` reports the candidates after every stage (``samplechain.trace``).

Every RNG sampler gets the same ``seed``, as in llama.cpp, so the tokens are llama.cpp's.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.grammar import GrammarSampler, json_schema_to_gbnf
from samplechain.params.checks import TRIGGER_PATTERN, TRIGGER_TOKEN, TRIGGER_WORD
from samplechain.params.sampling_params import SamplingParams
from samplechain.samplers import (
    DRY,
    XTC,
    AdaptiveP,
    Dist,
    DynamicTemperature,
    Infill,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    ReasoningBudget,
    ReasoningBudgetState,
    Sampler,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)
from samplechain.validate import INT32_MAX, check_int
from samplechain.vocab import Vocab

# observe(name, sampler, candidates): "logits" with no sampler for a pass's fresh candidates, then each stage's
# display name and sampler, with the candidates as it left them
Observer = Callable[[str, Sampler | None, Candidates], None]


def _starts_with_space(data: bytes) -> bool:
    return data[:1] in (b" ", b"\t", b"\n", b"\v", b"\f", b"\r")  # C isspace


def tokenize_logit_bias(bias: Iterable[tuple[int | str, float]], vocab: Vocab | None) -> list[tuple[int, float]]:
    """Biases of texts as biases of their tokens (each token of a text gets the text's bias); ids stay."""
    out: list[tuple[int, float]] = []
    for token, b in bias:
        if isinstance(token, str):
            if vocab is None:
                raise ValueError(f"logit_bias for text {token!r} needs a vocabulary to tokenize it")
            out.extend((t, b) for t in vocab.tokenize(token))
        else:
            out.append((token, b))
    return out


class CommonSampler:
    """llama.cpp's ``common_sampler``: the chain built from parameters, plus history, grammar, reasoning budget
    and probabilities.

    ``grammar`` is any sampler that masks (sets to -inf) the tokens it refuses and follows accepted tokens;
    it is kept outside the chain and applied first (``grammar_first``) or by rejection.
    ``reasoning_budget`` replaces the one built from the parameters; it is applied before everything else.
    """

    def __init__(
        self,
        params: SamplingParams | None = None,
        vocab: Vocab | None = None,
        *,
        n_vocab: int | None = None,
        grammar: Sampler | None = None,
        reasoning_budget: ReasoningBudget | None = None,
    ) -> None:
        self.params = params if params is not None else SamplingParams()
        self.vocab = vocab
        if vocab is not None:
            if n_vocab is not None and n_vocab != vocab.n_tokens:
                raise ValueError(f"n_vocab {n_vocab} does not match the vocabulary's {vocab.n_tokens} tokens")
            n_vocab = vocab.n_tokens
        self.n_vocab = None if n_vocab is None else check_int("n_vocab", n_vocab, minimum=1)
        self.grammar = grammar if grammar is not None else self._build_grammar()
        self._budget_prefill: tuple[int, ...] = ()
        if reasoning_budget is not None:
            if not isinstance(reasoning_budget, ReasoningBudget):
                raise ValueError(f"reasoning_budget must be a ReasoningBudget, got {type(reasoning_budget).__name__}")
            self.reasoning_budget: ReasoningBudget | None = reasoning_budget
        else:
            self.reasoning_budget = self._build_reasoning_budget()
        self.chain = self._build_chain()
        self.prev: deque[int] = deque(maxlen=max(32, self.params.n_prev))
        self._cur: Candidates | None = None
        self._t_total_us = 0.0

    # --- construction ------------------------------------------------------------------------------------

    def _build_grammar(self) -> GrammarSampler | None:
        """The grammar sampler from ``grammar`` / ``json_schema`` / lazy triggers (common_sampler_init)."""
        p = self.params
        text = p.grammar
        if p.json_schema is not None:
            text = json_schema_to_gbnf(p.json_schema)
        if not text.strip():
            return None
        if self.vocab is None:
            raise ValueError("a grammar needs the vocabulary: pass vocab to CommonSampler")
        if not p.grammar_lazy:
            return GrammarSampler(self.vocab, text)
        patterns: list[str] = []
        tokens: list[int] = []
        for kind, value, token in p.grammar_triggers:
            if kind == TRIGGER_TOKEN:
                tokens.append(token)
            elif kind == TRIGGER_WORD:
                ids = self.vocab.tokenize(value, parse_special=True)
                if len(ids) == 1:  # llama-server: a one-token word triggers by id and must be preserved
                    if value not in p.preserved_tokens:
                        raise ValueError(f"Grammar trigger word should be marked as preserved token: {value!r}")
                    tokens.append(ids[0])
                else:
                    patterns.append(re.escape(value))
            elif kind == TRIGGER_PATTERN:
                patterns.append(value)
            else:
                anchored = value if value.startswith("^") else "^" + value
                patterns.append(anchored if anchored.endswith("$") else anchored + "$")
        if p.grammar_triggers and not patterns and not tokens:
            raise ValueError("no triggers set for lazy grammar!")
        return GrammarSampler.lazy(self.vocab, text, "root", patterns, tokens)

    def _tag_tokens(self, name: str, tag: str | tuple[int, ...]) -> tuple[int, ...]:
        """A reasoning tag's token ids: texts are tokenized with special tokens parsed (llama-server)."""
        if isinstance(tag, str):
            if not tag:
                return ()
            if self.vocab is None:
                raise ValueError(f"{name} {tag!r} is a text: pass vocab to CommonSampler to tokenize it, "
                                 f"or give token ids")
            return tuple(self.vocab.tokenize(tag, parse_special=True))
        if self.n_vocab is not None and any(t >= self.n_vocab for t in tag):
            bad = next(t for t in tag if t >= self.n_vocab)
            raise ValueError(f"{name} token {bad} is outside the vocabulary [0, {self.n_vocab})")
        return tag

    def _prefill_tokens(self) -> tuple[int, ...]:
        """``generation_prompt`` as tokens, without a leading whitespace token the tokenizer added."""
        text = self.params.generation_prompt
        if not text:
            return ()
        if self.vocab is None:
            raise ValueError("generation_prompt needs the vocabulary: pass vocab to CommonSampler")
        tokens = self.vocab.tokenize(text, parse_special=True)
        # some tokenizers put a space before a leading special token: dropped unless the text starts with one
        if tokens and _starts_with_space(self.vocab.piece(tokens[0], special=True)) and \
                not _starts_with_space(text.encode()):
            tokens = tokens[1:]
        return tuple(tokens)

    def _build_reasoning_budget(self) -> ReasoningBudget | None:
        """llama.cpp's rule (``common_sampler_init``): start and end tags set, and a limit, control or a lazy grammar;
        forced = message + first end tag; starts IDLE and sees the ``generation_prompt`` tokens."""
        p = self.params
        start = self._tag_tokens("reasoning_budget_start_tag", p.reasoning_budget_start_tag)
        ends = [t for t in (self._tag_tokens("reasoning_budget_end_tags", e) for e in p.reasoning_budget_end_tags)
                if t]
        if not start or not ends or not (p.grammar_lazy or p.reasoning_budget_tokens >= 0 or p.reasoning_control):
            return None
        if p.reasoning_budget_forced is not None:
            forced = self._tag_tokens("reasoning_budget_forced", p.reasoning_budget_forced)
        else:
            forced = self._tag_tokens("reasoning_budget_message", p.reasoning_budget_message) + ends[0]
        budget = p.reasoning_budget_tokens if p.reasoning_budget_tokens >= 0 else INT32_MAX
        rb = ReasoningBudget(self.vocab, [start], ends, forced, budget)
        self._budget_prefill = self._prefill_tokens()
        for token in self._budget_prefill:
            rb.accept(token)
        return rb

    def _logit_biases(self) -> list[tuple[int, float]]:
        p = self.params
        out: list[tuple[int, float]] = []
        for token, bias in tokenize_logit_bias(p.logit_bias, self.vocab):
            if self.n_vocab is not None and token >= self.n_vocab:
                raise ValueError(f"logit_bias token {token} is outside the vocabulary [0, {self.n_vocab})")
            out.append((token, bias))
        if p.ignore_eos and self.vocab is not None:
            out.extend((t, -math.inf) for t in sorted(self.vocab.eog))
        return out

    def _build_chain(self) -> Chain:
        p = self.params
        members: list[Sampler] = [LogitBias(self.n_vocab, self._logit_biases())]
        if p.mirostat == 0:
            for name in p.samplers:
                s = self._make(name)
                if s is not None:
                    members.append(s)
            if "adaptive_p" in p.samplers:
                members.append(AdaptiveP(p.adaptive_target, p.adaptive_decay, p.seed))
            else:
                members.append(Dist(p.seed))
        else:
            members.append(Temperature(p.temperature))
            if p.mirostat == 1:
                if self.n_vocab is None:
                    raise ValueError("mirostat 1 needs the vocabulary size: pass vocab or n_vocab")
                members.append(Mirostat(self.n_vocab, p.seed, p.mirostat_tau, p.mirostat_eta, 100))
            else:
                members.append(MirostatV2(p.seed, p.mirostat_tau, p.mirostat_eta))
        return Chain((s for s in members if not s.disabled), perf=not p.no_perf)

    def _make(self, name: str) -> Sampler | None:
        p = self.params
        if name == "penalties":
            return Penalties(p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
        if name == "dry":  # a disabled DRY needs no vocabulary; the chain leaves it out
            return DRY(self.vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n,
                       p.dry_sequence_breakers)
        if name == "top_n_sigma":
            return TopNSigma(p.top_n_sigma)
        if name == "top_k":
            return TopK(p.top_k)
        if name == "typ_p":
            return Typical(p.typical_p, p.min_keep)
        if name == "top_p":
            return TopP(p.top_p, p.min_keep)
        if name == "min_p":
            return MinP(p.min_p, p.min_keep)
        if name == "xtc":
            return XTC(p.xtc_probability, p.xtc_threshold, p.min_keep, p.seed)
        if name == "temperature":
            return DynamicTemperature(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
        if name == "infill":
            return Infill(self.vocab)
        return None  # adaptive_p: only marks that the selector is adaptive-p

    # --- sampling ----------------------------------------------------------------------------------------

    def grammar_applies(self) -> bool:
        """A grammar exists, and it is not a lazy one inside an open thinking block (llama.cpp's
        ``grammar_should_apply``): the next step's
        token is checked against it (or masked by it first), and the grammar sees the token."""
        if self.grammar is None:
            return False
        rb = self.reasoning_budget
        if rb is None or not getattr(self.grammar, "is_lazy", False):
            return True
        return rb.state in (ReasoningBudgetState.IDLE, ReasoningBudgetState.DONE)

    def grammar_allows(self, token: int) -> bool:
        """Whether the grammar in its current state accepts ``token`` next (True without a grammar); reads only."""
        if self.grammar is None:
            return True
        allows = getattr(self.grammar, "allows", None)
        if allows is not None:
            return allows(token)
        single = Candidates(np.array([token], dtype=np.int32), np.ones(1, dtype=np.float32))
        self.grammar.apply(single)
        return bool(np.isfinite(single.logits[0]))

    def stages(self, with_grammar: bool) -> list[Sampler]:
        """The samplers one pass of a step applies, in order: the reasoning budget, the grammar
        (``with_grammar``, when there is one), then the chain's members; the last one selects the token."""
        return [*self._before_chain(with_grammar), *self.chain.samplers]

    def _before_chain(self, with_grammar: bool) -> list[Sampler]:
        out: list[Sampler] = [] if self.reasoning_budget is None else [self.reasoning_budget]
        if with_grammar and self.grammar is not None:
            out.append(self.grammar)
        return out

    def select(self, logits: object, with_grammar: bool, observe: Observer | None
               ) -> tuple[Candidates | Callable[[], Candidates], int]:
        """One pass of :meth:`stages` over fresh candidates: the candidates (or a function building them, for
        :meth:`record`) and the selected token, accepted by nothing (:meth:`sample` is two of these, the second one
        on a grammar rejection, then :meth:`accept`). Unobserved, the chain runs as one ``Chain.apply`` (its fused
        steps are bitwise its members applied one by one: tests/test_fused_chain.py), or as one compiled call
        when nothing runs before it (``Chain.select_whole``: the same token, draws and candidates)."""
        if observe is None and self.reasoning_budget is None and (self.grammar is None or not with_grammar):
            fast = self.chain.select_whole(logits)
            if fast is not None:
                return fast[1], fast[0]
        c = Candidates.from_logits(logits)
        if observe is None:
            for s in self._before_chain(with_grammar):
                s.apply(c)
            self.chain.apply(c)
        else:
            observe("logits", None, c)
            for s in self.stages(with_grammar):
                s.apply(c)
                observe(s.display_name, s, c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"no token could be selected ({self.chain.describe()})")
        return c, int(c.ids[c.selected])

    def sample(self, logits: object, grammar_first: bool = False, observe: Observer | None = None) -> int:
        """Sample one token from ``logits`` and accept it (as generated); returns the token id.

        Order (llama.cpp's ``common_sampler_sample``): :meth:`stages`, with the grammar among them
        (``grammar_first``) or checking the selected token afterwards; a token the grammar refuses is sampled again
        from fresh logits with the grammar applied (rejection). ``observe(name, sampler, candidates)``, when given,
        sees each pass's fresh candidates (``"logits"``, None) and the candidates after every stage (its display name
        and sampler); a second ``"logits"`` means the grammar refused the first pass's token. It reads the
        candidates, never writes them.
        """
        t0 = time.perf_counter()
        has_grammar = self.grammar_applies()
        c, token = self.select(logits, has_grammar and grammar_first, observe)
        if has_grammar and not grammar_first and not self.grammar_allows(token):
            c, token = self.select(logits, True, observe)  # rejection: resample from fresh logits with the mask
        self._cur = c
        self._t_total_us += (time.perf_counter() - t0) * 1e6
        self.accept(token, is_generated=True)
        return token

    def accept(self, token: int, is_generated: bool = False) -> None:
        """Record ``token`` in the history and the chain; the reasoning budget and the grammar see only
        generated tokens (llama.cpp's ``common_sampler_accept``)."""
        t0 = time.perf_counter()
        token = check_int("token", token, minimum=0)
        if self.n_vocab is not None and token >= self.n_vocab:
            raise ValueError(f"token {token} is outside the vocabulary [0, {self.n_vocab})")
        accept_grammar = is_generated and self.grammar_applies()  # before the budget sees the token
        rb = self.reasoning_budget
        if rb is not None and is_generated:
            rb.accept(token)
            # a lazy grammar skipped the block: replay the end sequence that closed it (it may be the trigger)
            if self.grammar is not None and not accept_grammar and rb.state == ReasoningBudgetState.DONE:
                for end_token in rb.end_match or ():
                    self.grammar.accept(end_token)
        if accept_grammar:
            self.grammar.accept(token)
        self.chain.accept(token)
        self.prev.append(token)
        self._t_total_us += (time.perf_counter() - t0) * 1e6

    def sample_and_accept_n(self, logits_rows: Sequence[object], draft: Sequence[int],
                            grammar_first: bool = False) -> list[int]:
        """Speculative verification: sample row i, stop at the first disagreement with ``draft[i]``.

        ``logits_rows`` has ``len(draft) + 1`` rows; returns 1 to ``len(draft) + 1`` accepted tokens.
        """
        if len(logits_rows) != len(draft) + 1:
            raise ValueError(f"need len(draft) + 1 = {len(draft) + 1} logits rows, got {len(logits_rows)}")
        out: list[int] = []
        for i, expected in enumerate(draft):
            token = self.sample(logits_rows[i], grammar_first)
            out.append(token)
            if token != expected:
                return out
            if self.vocab is not None and self.vocab.is_eog(token) and i + 1 < len(draft):
                return out
        out.append(self.sample(logits_rows[len(draft)], grammar_first))
        return out

    # --- state -------------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Clear the history and reset the chain, the grammar and the reasoning budget (the budget as built:
        it sees ``generation_prompt`` again). llama.cpp's ``common_sampler_reset`` resets only the history and
        the chain."""
        self.prev.clear()
        self.chain.reset()
        if self.grammar is not None:
            self.grammar.reset()
        if self.reasoning_budget is not None:
            self.reasoning_budget.reset()
            for token in self._budget_prefill:
                self.reasoning_budget.accept(token)

    def force_reasoning_end(self) -> bool:
        """End the open thinking block now (llama-server's ``reasoning_end`` control): True when the budget
        was counting and now forces its end sequence, False otherwise (no budget, or not inside a block)."""
        return self.reasoning_budget is not None and self.reasoning_budget.force()

    def clone(self) -> CommonSampler:
        other = CommonSampler.__new__(CommonSampler)
        other.params = self.params
        other.vocab = self.vocab
        other.n_vocab = self.n_vocab
        other.grammar = None if self.grammar is None else self.grammar.clone()
        other.reasoning_budget = None if self.reasoning_budget is None else self.reasoning_budget.clone()
        other._budget_prefill = self._budget_prefill
        other.chain = self.chain.clone()
        other.prev = deque(self.prev, maxlen=self.prev.maxlen)
        c = self.candidates
        other._cur = None if c is None else c.copy()
        other._t_total_us = 0.0
        return other

    # --- the device path's view (samplechain.device.protocol.RowSampler) ---------------------------------

    @property
    def samplers(self) -> list[Sampler]:
        """The chain's samplers, in order (a device prefix is planned from them)."""
        return self.chain.samplers

    @property
    def cpu_only(self) -> bool:
        """A grammar or a reasoning budget: every step runs through :meth:`sample` on the CPU (llama.cpp turns
        backend sampling off for them)."""
        return self.grammar is not None or self.reasoning_budget is not None

    def record(self, candidates: Any) -> None:
        """The final candidates of a step sampled elsewhere (on the device), or a function building them on
        first read: what :attr:`candidates` and :meth:`top_probs` report until the next step."""
        self._cur = candidates

    @property
    def candidates(self) -> Candidates | None:
        """The candidates of the last sampling step, after the chain."""
        if callable(self._cur):
            self._cur = self._cur()
        return self._cur

    def top_probs(self, n: int) -> list[tuple[int, float]]:
        """Post-sampling probabilities of the last step: up to ``n`` (token, p) by descending p, stopping at
        the first zero probability (llama-server's ``post_sampling_probs``)."""
        n = check_int("n", n, minimum=0)
        c = self.candidates
        if c is None or n == 0:
            return []
        probs = c.probs
        if probs is None:
            raise ValueError("the last step's chain left no probabilities")
        order = np.argsort(-probs, kind="stable")[:n]
        out = []
        ids = c.ids
        for i in order:
            if probs[i] == 0.0:
                break
            out.append((int(ids[i]), float(probs[i])))
        return out

    def last(self) -> int:
        if not self.prev:
            raise ValueError("no token has been accepted yet")
        return self.prev[-1]

    def prev_str(self, n: int) -> str:
        if self.vocab is None:
            raise ValueError("prev_str needs a vocabulary")
        tokens = list(self.prev)[-n:] if n > 0 else []
        return self.vocab.detokenize(tokens)

    @property
    def seed(self) -> int | None:
        return self.chain.seed

    @property
    def perf(self) -> dict[str, float]:
        """``t_total_ms`` (sample + accept) and the chain's ``t_sample_ms`` / ``n_sample``."""
        cp = self.chain.perf
        return {"t_total_ms": self._t_total_us / 1000.0, "t_sample_ms": cp.t_sample_ms, "n_sample": cp.n_sample}

    def describe(self) -> str:
        return self.chain.describe()
