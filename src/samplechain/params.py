"""``SamplingParams`` (llama.cpp's ``common_params_sampling``) and ``CommonSampler`` (``common/sampling.cpp``).

The chain ``CommonSampler`` builds (spec/samplers §5.2):

1. ``logit-bias`` first, when any bias is set (user biases, then ``-inf`` for every EOG token with
   ``ignore_eos``);
2. with ``mirostat == 0``: one sampler per entry of ``samplers``, in order (default
   ``penalties; dry; top_n_sigma; top_k; typ_p; top_p; min_p; xtc; temperature``), then ``adaptive-p`` if
   ``adaptive_p`` appears in the list, else ``dist``; ``temperature`` is llama.cpp's ``temp_ext``;
3. with ``mirostat == 1`` or ``2``: ``temp`` then ``mirostat`` / ``mirostat-v2``; every other sampler is dropped;
4. samplers whose parameters make them no-ops are left out (``describe()`` shows what runs).

Outside the chain, as in llama.cpp (spec/samplers §5.5, §5.10): the reasoning budget (created when start and
end tags are set and ``reasoning_budget_tokens >= 0``, ``reasoning_control`` or ``grammar_lazy``) is applied
first, then the grammar (``grammar_first``) or the chain with the grammar checked by rejection. Both only see
generated tokens; a lazy grammar waits while a thinking block is open.

Every RNG sampler gets the same ``seed``, as in llama.cpp, so the tokens are llama.cpp's.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.grammar import GrammarSampler, json_schema_to_gbnf
from samplechain.rng import DEFAULT_SEED, check_seed
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
from samplechain.samplers._ops import check_int, check_number
from samplechain.samplers.dry import DEFAULT_SEQ_BREAKERS
from samplechain.vocab import Vocab

INT32_MAX = 2**31 - 1

# canonical name -> (one-letter code, extra accepted names); spec/samplers §5.3
SAMPLER_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "penalties": ("e", ()),
    "dry": ("d", ()),
    "top_n_sigma": ("s", ("top-n-sigma", "topnsigma")),
    "top_k": ("k", ("top-k", "topk")),
    "typ_p": ("y", ("typ-p", "typp", "typ")),
    "top_p": ("p", ("top-p", "topp", "nucleus")),
    "min_p": ("m", ("min-p", "minp")),
    "xtc": ("x", ()),
    "temperature": ("t", ("temp",)),
    "infill": ("i", ()),
    "adaptive_p": ("a", ("adaptive-p", "adaptivep")),
}
_BY_NAME = {alias: name for name, (_, aliases) in SAMPLER_TYPES.items() for alias in (name, *aliases)}
_BY_CHAR = {char: name for name, (char, _) in SAMPLER_TYPES.items()}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


def parse_sampler_names(names: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical sampler names from a ``;``-separated string or a list of names (case-insensitive)."""
    if isinstance(names, str):
        items = names.split(";") if names else []
    else:
        items = list(names)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"sampler names must be strings, got {item!r}")
        name = _BY_NAME.get(item.lower())
        if name is None:
            known = ", ".join(SAMPLER_TYPES)
            raise ValueError(f"unknown sampler name {item!r} (known: {known} and their aliases)")
        out.append(name)
    return tuple(out)


def parse_sampler_chars(chars: str) -> tuple[str, ...]:
    """Canonical sampler names from one-letter codes, e.g. ``"edskypmxt"``."""
    out = []
    for ch in chars:
        name = _BY_CHAR.get(ch)
        if name is None:
            raise ValueError(f"unknown sampler code {ch!r} (known: {''.join(_BY_CHAR)})")
        out.append(name)
    return tuple(out)


def sampler_chars(names: Iterable[str]) -> str:
    return "".join(SAMPLER_TYPES[n][0] for n in names)


@dataclass
class SamplingParams:
    """Every llama.cpp sampling parameter with its default; field names are llama-server's request fields."""

    seed: int = DEFAULT_SEED
    n_prev: int = 64
    n_probs: int = 0
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10
    typical_p: float = 1.0
    temperature: float = 0.80
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_SEQ_BREAKERS
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.90
    mirostat: int = 0
    top_n_sigma: float = -1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    ignore_eos: bool = False
    no_perf: bool = False
    post_sampling_probs: bool = False
    backend_sampling: bool = False
    backend_dist: bool = False  # with backend_sampling: the final draw on the device too (else on the CPU)
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: tuple[tuple[int | str, float], ...] = ()
    grammar: str = ""
    json_schema: Any = None  # a schema (dict) or its JSON text; wins over ``grammar`` (llama-server)
    grammar_lazy: bool = False
    grammar_triggers: tuple[tuple[int, str, int | None], ...] = ()  # (type, value, token); TRIGGER_* types
    preserved_tokens: tuple[str, ...] = ()
    # the assistant prefix the chat template already put in the prompt; fed to the reasoning budget, so a prompt
    # ending in a start tag opens the thinking block (llama.cpp also feeds it to output-format grammars)
    generation_prompt: str = ""
    # reasoning budget (spec/samplers §3.19, §5.10); tags are texts (tokenized with special tokens) or token ids
    reasoning_budget_tokens: int = -1  # tokens allowed inside a thinking block; -1 = no limit
    reasoning_budget_start_tag: str | tuple[int, ...] = ""
    reasoning_budget_end_tags: tuple[str | tuple[int, ...], ...] = ()  # the first one closes a forced block
    reasoning_budget_message: str = ""  # forced before the first end tag when the budget is spent
    reasoning_budget_forced: tuple[int, ...] | None = None  # token ids forced instead of message + first end tag
    reasoning_control: bool = False  # keep a budget sampler even without a limit, so force_reasoning_end() works

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        for name in ("n_prev", "n_probs", "min_keep", "repeat_last_n", "dry_allowed_length",
                     "dry_penalty_last_n"):
            setattr(self, name, check_int(name, getattr(self, name), minimum=0))
        self.top_k = check_int("top_k", self.top_k)
        for name in ("top_p", "min_p", "xtc_probability", "xtc_threshold", "typical_p", "temperature",
                     "dynatemp_range", "dynatemp_exponent", "frequency_penalty", "presence_penalty",
                     "dry_multiplier", "dry_base", "adaptive_target", "top_n_sigma", "mirostat_tau",
                     "mirostat_eta"):
            setattr(self, name, check_number(name, getattr(self, name)))
        rp = check_number("repeat_penalty", self.repeat_penalty)
        if not rp > 0.0 or math.isinf(1.0 / rp):
            raise ValueError(f"repeat_penalty must be > 0 with a finite reciprocal, got {rp} (1.0 disables it)")
        self.repeat_penalty = rp
        decay = check_number("adaptive_decay", self.adaptive_decay)
        if not 0.0 <= decay <= 0.99:
            raise ValueError(f"adaptive_decay must be in [0, 0.99], got {decay}")
        self.adaptive_decay = decay
        self.mirostat = check_int("mirostat", self.mirostat)
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}")
        for name in ("ignore_eos", "no_perf", "post_sampling_probs", "backend_sampling", "backend_dist"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        breakers = self.dry_sequence_breakers
        breakers = (breakers,) if isinstance(breakers, str) else tuple(breakers)
        for b in breakers:
            if not isinstance(b, str):
                raise ValueError(f"dry_sequence_breakers must be strings, got {b!r}")
        self.dry_sequence_breakers = breakers
        self.samplers = parse_sampler_names(self.samplers)
        self.logit_bias = _parse_logit_bias(self.logit_bias)
        if not isinstance(self.grammar, str):
            raise ValueError(f"grammar must be GBNF text, got {type(self.grammar).__name__}")
        if self.json_schema is not None and not isinstance(self.json_schema, (dict, str, bool)):
            raise ValueError(f"json_schema must be an object (or its JSON text), got {type(self.json_schema).__name__}")
        if not isinstance(self.grammar_lazy, bool):
            raise ValueError(f"grammar_lazy must be true or false, got {self.grammar_lazy!r}")
        self.grammar_triggers = tuple(_parse_trigger(t) for t in self.grammar_triggers)
        if isinstance(self.preserved_tokens, str) or not all(isinstance(t, str) for t in self.preserved_tokens):
            raise ValueError("preserved_tokens must be a list of strings")
        self.preserved_tokens = tuple(self.preserved_tokens)
        self._check_reasoning_budget()

    def _check_reasoning_budget(self) -> None:
        budget = check_int("reasoning_budget_tokens", self.reasoning_budget_tokens)
        if not -1 <= budget <= INT32_MAX:
            raise ValueError(f"reasoning_budget_tokens must be -1 (no limit) or in [0, {INT32_MAX}], got {budget}")
        self.reasoning_budget_tokens = budget
        self.reasoning_budget_start_tag = _tag("reasoning_budget_start_tag", self.reasoning_budget_start_tag)
        ends = self.reasoning_budget_end_tags
        if isinstance(ends, str) or not isinstance(ends, Iterable):
            ends = (ends,)
        # empty tags are skipped, as llama-server does
        self.reasoning_budget_end_tags = tuple(t for t in (_tag("reasoning_budget_end_tags", e) for e in ends) if t)
        for name in ("reasoning_budget_message", "generation_prompt"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.reasoning_budget_forced is not None:
            self.reasoning_budget_forced = _token_list("reasoning_budget_forced", self.reasoning_budget_forced)
        if not isinstance(self.reasoning_control, bool):
            raise ValueError(f"reasoning_control must be true or false, got {self.reasoning_control!r}")

    # --- server request fields ---------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Parameters from a llama-server request body (sampling fields only; ``null`` = absent).

        Follows the server: clamps where it clamps, errors where it errors; unknown fields and values of the
        wrong type raise ``ValueError`` naming the field.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"sampling parameters must be a JSON object, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if value is None:
                continue
            name = _ALIASES.get(key, key)
            if name != key and data.get(name) is not None:
                continue  # the field's own name wins over an alias (llama-server tries the names in order)
            parse = _SERVER_FIELDS.get(name)
            if parse is None:
                raise ValueError(f"unknown sampling parameter {key!r}")
            try:
                kwargs[name] = parse(value)
            except (TypeError, ValueError) as e:
                raise ValueError(f"invalid value for {key!r}: {e}") from None
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"invalid sampling parameters: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The request-field form; ``from_dict(p.to_dict()) == p``."""
        d = dataclasses.asdict(self)
        d["dry_sequence_breakers"] = list(self.dry_sequence_breakers)
        d["samplers"] = list(self.samplers)
        d["logit_bias"] = [[t, b if math.isfinite(b) else False] for t, b in self.logit_bias]
        d["grammar_triggers"] = [{"type": k, "value": v, **({"token": t} if t is not None else {})}
                                 for k, v, t in self.grammar_triggers]
        d["preserved_tokens"] = list(self.preserved_tokens)
        start = self.reasoning_budget_start_tag
        d["reasoning_budget_start_tag"] = start if isinstance(start, str) else list(start)
        d["reasoning_budget_end_tags"] = [t if isinstance(t, str) else list(t) for t in self.reasoning_budget_end_tags]
        forced = self.reasoning_budget_forced
        d["reasoning_budget_forced"] = None if forced is None else list(forced)
        return d

    @property
    def sampler_chars(self) -> str:
        return sampler_chars(self.samplers)


def _parse_logit_bias(value: object) -> tuple[tuple[int | str, float], ...]:
    """``[[token_or_text, bias_or_false], ...]`` or ``{"token_or_text": bias_or_false}``; false = -inf."""
    if isinstance(value, Mapping):
        items: Iterable = value.items()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(f"logit_bias must be a list of [token, bias] pairs or an object, got {value!r}")
    out = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"logit_bias entries must be [token, bias] pairs, got {item!r}")
        token, bias = item
        if isinstance(token, str) and isinstance(value, Mapping):
            try:
                token = int(token)
            except ValueError:
                pass
        if isinstance(token, bool) or not isinstance(token, (int, str)):
            raise ValueError(f"logit_bias token must be an id or a text, got {token!r}")
        if isinstance(token, int) and token < 0:
            raise ValueError(f"logit_bias token id must be >= 0, got {token}")
        if bias is False:
            bias = -math.inf
        bias = check_number(f"logit_bias of {token!r}", bias, finite=False)
        if bias == math.inf:
            raise ValueError(f"logit_bias of {token!r} must not be +inf")
        out.append((token, bias))
    return tuple(out)


def _token_list(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of token ids, got {value!r}")
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"{name} must be a list of token ids (integers >= 0), got {t!r}")
        out.append(int(t))
    return tuple(out)


def _tag(name: str, value: object) -> str | tuple[int, ...]:
    """A reasoning tag: a text (tokenized later, with the vocabulary) or a list of token ids."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return _token_list(name, value)
    raise ValueError(f"{name} must be a text or a list of token ids, got {value!r}")


def _starts_with_space(data: bytes) -> bool:
    return data[:1] in (b" ", b"\t", b"\n", b"\v", b"\f", b"\r")  # C isspace


# grammar trigger types (llama.cpp's common_grammar_trigger_type, spec/grammar §4.3)
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = range(4)


def _parse_trigger(t: object) -> tuple[int, str, int | None]:
    """A trigger as ``{"type": int, "value": str, "token": int?}`` or a ``(type, value, token)`` tuple."""
    if isinstance(t, Mapping):
        kind, value, token = t.get("type"), t.get("value"), t.get("token")
    elif isinstance(t, (list, tuple)) and len(t) in (2, 3):
        kind, value, token = (*t, None)[:3]
    else:
        raise ValueError(f"grammar trigger must be an object with type and value, got {t!r}")
    if isinstance(kind, bool) or kind not in (TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL):
        raise ValueError(f"grammar trigger type must be 0 (token), 1 (word), 2 (pattern) or 3 (full pattern), "
                         f"got {kind!r}")
    if not isinstance(value, str):
        raise ValueError(f"grammar trigger value must be a string, got {value!r}")
    if token is not None and (isinstance(token, bool) or not isinstance(token, int) or token < 0):
        raise ValueError(f"grammar trigger token must be a token id, got {token!r}")
    if kind == TRIGGER_TOKEN and token is None:
        raise ValueError(f"grammar trigger {value!r} of type token needs a token id")
    return kind, value, token


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _as_bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _clamp(lo: float, hi: float, conv=_as_float):
    def parse(v: object) -> Any:
        x = conv(v)
        return x if math.isnan(x) else min(max(x, lo), hi)
    return parse


def _int_range(lo: int, hi: int):
    def parse(v: object) -> int:
        x = _as_int(v)
        if not lo <= x <= hi:
            raise ValueError(f"must be in [{lo}, {hi}], got {x}")
        return x
    return parse


def _dry_base(v: object) -> float:
    x = _as_float(v)
    return x if x >= 1.0 else 1.75  # the server replaces values below 1 with its default


def _breakers(v: object) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(s, str) for s in v):
        raise ValueError("must be a non-empty array of strings")
    return tuple(v)


def _samplers(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        return parse_sampler_chars(v)
    if isinstance(v, list):
        return parse_sampler_names(v)
    raise ValueError("must be an array of names or a string of one-letter codes")


def _string(v: object) -> str:
    return v if isinstance(v, str) else _fail("must be a string")


def _end_tags(v: object) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(v, str):  # reasoning_budget_end_tag: one tag
        return (v,)
    if not isinstance(v, list):
        raise ValueError("must be an array of strings (or one string)")
    return tuple(_tag("reasoning_budget_end_tags", t) for t in v)


def _seed(v: object) -> int:
    x = _as_int(v)
    return DEFAULT_SEED if x == -1 else x


_SERVER_FIELDS = {
    "seed": _seed,
    "n_prev": _int_range(0, INT32_MAX),
    "n_probs": lambda v: max(_as_int(v), 0),
    "min_keep": _int_range(0, INT32_MAX),
    "top_k": _clamp(0, INT32_MAX, _as_int),
    "top_p": _clamp(0.0, 1.0),
    "min_p": _clamp(0.0, 1.0),
    "xtc_probability": _clamp(0.0, 1.0),
    "xtc_threshold": _clamp(0.0, 1.0),
    "typical_p": _as_float,
    "temperature": _clamp(0.0, math.inf),
    "dynatemp_range": _as_float,
    "dynatemp_exponent": _as_float,
    "repeat_last_n": _int_range(0, INT32_MAX),
    "repeat_penalty": _as_float,
    "frequency_penalty": _as_float,
    "presence_penalty": _as_float,
    "dry_multiplier": _as_float,
    "dry_base": _dry_base,
    "dry_allowed_length": _int_range(0, INT32_MAX),
    "dry_penalty_last_n": _int_range(0, INT32_MAX),
    "dry_sequence_breakers": _breakers,
    "adaptive_target": _clamp(-math.inf, 1.0),
    "adaptive_decay": _as_float,
    "mirostat": _clamp(0, 2, _as_int),
    "top_n_sigma": _as_float,
    "mirostat_tau": _as_float,
    "mirostat_eta": _as_float,
    "ignore_eos": _as_bool,
    "no_perf": _as_bool,
    "post_sampling_probs": _as_bool,
    "backend_sampling": _as_bool,
    "backend_dist": _as_bool,
    "samplers": _samplers,
    "logit_bias": _parse_logit_bias,
    "grammar": lambda v: v if isinstance(v, str) else _fail("must be a string"),
    "json_schema": lambda v: v if isinstance(v, (dict, bool)) else _fail("must be an object"),
    "grammar_lazy": _as_bool,
    "grammar_triggers": lambda v: tuple(v) if isinstance(v, list) else _fail("must be an array"),
    "preserved_tokens": lambda v: tuple(v) if isinstance(v, list) else _fail("must be an array"),
    "generation_prompt": _string,
    "reasoning_budget_tokens": _int_range(-1, INT32_MAX),
    "reasoning_budget_start_tag": lambda v: _tag("reasoning_budget_start_tag", v),
    "reasoning_budget_end_tags": _end_tags,
    "reasoning_budget_message": _string,
    "reasoning_budget_forced": lambda v: _token_list("reasoning_budget_forced", v),
    "reasoning_control": _as_bool,
}


def _fail(message: str) -> Any:
    raise ValueError(message)
# llama-server aliases and llama.cpp's common_params_sampling names
_ALIASES = {
    "logprobs": "n_probs", "temp": "temperature", "typ_p": "typical_p", "penalty_last_n": "repeat_last_n",
    "penalty_repeat": "repeat_penalty", "penalty_freq": "frequency_penalty",
    "penalty_present": "presence_penalty",
    "thinking_budget_tokens": "reasoning_budget_tokens", "reasoning_budget_end_tag": "reasoning_budget_end_tags",
    "reasoning_budget_start": "reasoning_budget_start_tag", "reasoning_budget_end": "reasoning_budget_end_tags",
}


class CommonSampler:
    """llama.cpp's ``common_sampler``: the chain built from parameters, plus history, grammar, reasoning budget
    and probabilities.

    ``grammar`` is any sampler that masks (sets to -inf) the tokens it refuses and follows accepted tokens;
    it is kept outside the chain and applied first (``grammar_first``) or by rejection (spec §5.5).
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
        """``generation_prompt`` as tokens, without a leading whitespace token the tokenizer added (§5.2)."""
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
        """llama.cpp's rule (spec §5.2 step 6): start and end tags set, and a limit, control or a lazy grammar;
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
        for token, bias in p.logit_bias:
            if isinstance(token, str):
                if self.vocab is None:
                    raise ValueError(f"logit_bias for text {token!r} needs a vocabulary to tokenize it")
                out.extend((t, bias) for t in self.vocab.tokenize(token))
            else:
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

    def _select(self, logits: object, with_grammar: bool) -> tuple[Candidates, int]:
        c = Candidates.from_logits(logits)
        if self.reasoning_budget is not None:
            self.reasoning_budget.apply(c)
        if with_grammar:
            self.grammar.apply(c)
        self.chain.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"no token could be selected ({self.chain.describe()})")
        return c, int(c.ids[c.selected])

    def _grammar_allows(self, token: int) -> bool:
        allows = getattr(self.grammar, "allows", None)
        if allows is not None:
            return allows(token)
        single = Candidates(np.array([token], dtype=np.int32), np.ones(1, dtype=np.float32))
        self.grammar.apply(single)
        return bool(np.isfinite(single.logits[0]))

    def _grammar_should_apply(self) -> bool:
        """A grammar exists, and it is not a lazy one inside an open thinking block (spec §5.5)."""
        if self.grammar is None:
            return False
        rb = self.reasoning_budget
        if rb is None or not getattr(self.grammar, "is_lazy", False):
            return True
        return rb.state in (ReasoningBudgetState.IDLE, ReasoningBudgetState.DONE)

    def sample(self, logits: object, grammar_first: bool = False) -> int:
        """Sample one token from ``logits`` and accept it (as generated); returns the token id.

        Order (spec §5.5): reasoning budget, then the grammar first or the chain with a rejection check."""
        t0 = time.perf_counter()
        has_grammar = self._grammar_should_apply()
        c, token = self._select(logits, has_grammar and grammar_first)
        if has_grammar and not grammar_first and not self._grammar_allows(token):
            c, token = self._select(logits, True)  # rejection: resample from fresh logits with the mask
        self._cur = c
        self._t_total_us += (time.perf_counter() - t0) * 1e6
        self.accept(token, is_generated=True)
        return token

    def accept(self, token: int, is_generated: bool = False) -> None:
        """Record ``token`` in the history and the chain; the reasoning budget and the grammar see only
        generated tokens (spec §5.6)."""
        t0 = time.perf_counter()
        token = check_int("token", token, minimum=0)
        if self.n_vocab is not None and token >= self.n_vocab:
            raise ValueError(f"token {token} is outside the vocabulary [0, {self.n_vocab})")
        accept_grammar = is_generated and self._grammar_should_apply()  # before the budget sees the token
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
        it sees ``generation_prompt`` again). llama.cpp resets only the history and the chain (P14)."""
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
        other._cur = None if self._cur is None else self._cur.copy()
        other._t_total_us = 0.0
        return other

    @property
    def candidates(self) -> Candidates | None:
        """The candidates of the last sampling step, after the chain."""
        return self._cur

    def top_probs(self, n: int) -> list[tuple[int, float]]:
        """Post-sampling probabilities of the last step: up to ``n`` (token, p) by descending p, stopping at
        the first zero probability (llama-server's ``post_sampling_probs``)."""
        n = check_int("n", n, minimum=0)
        c = self._cur
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
