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
from samplechain.param_specs import (
    INT32_MAX,
    at_least,
    boolean,
    cli_budget,
    cli_logit_bias,
    cli_number,
    cli_seed,
    custom,
    declarations,
    first_present,
    flag,
    hard,
    integer,
    json_float,
    number,
    param,
    plain,
    read_text_file,
    soft,
    text,
    unescape,
)
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


# --- the declarations' helpers: validation, llama-server's custom rules, the flags' glue ----------------------

def _check_repeat_penalty(name: str, value: object) -> float:
    rp = check_number(name, value)
    if not rp > 0.0 or math.isinf(1.0 / rp):
        raise ValueError(f"{name} must be > 0 with a finite reciprocal, got {rp} (1.0 disables it)")
    return rp


def _check_decay(name: str, value: object) -> float:
    decay = check_number(name, value)
    if not 0.0 <= decay <= 0.99:
        raise ValueError(f"{name} must be in [0, 0.99], got {decay}")
    return decay


def _check_mirostat(name: str, value: object) -> int:
    mode = check_int(name, value)
    if mode not in (0, 1, 2):
        raise ValueError(f"{name} must be 0 (off), 1 or 2, got {mode}")
    return mode


def _check_breakers(name: str, value: object) -> tuple[str, ...]:
    breakers = (value,) if isinstance(value, str) else tuple(value)  # type: ignore[arg-type]
    for b in breakers:
        if not isinstance(b, str):
            raise ValueError(f"{name} must be strings, got {b!r}")
    return breakers


def _check_grammar(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be GBNF text, got {type(value).__name__}")
    return value


def _check_json_schema(name: str, value: object) -> Any:
    if value is not None and not isinstance(value, (dict, str, bool)):
        raise ValueError(f"{name} must be an object (or its JSON text), got {type(value).__name__}")
    return value


def _check_preserved(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(t, str) for t in value):  # type: ignore[attr-defined]
        raise ValueError(f"{name} must be a list of strings")
    return tuple(value)  # type: ignore[arg-type]


def _check_budget(name: str, value: object) -> int:
    budget = check_int(name, value)
    if not -1 <= budget <= INT32_MAX:
        raise ValueError(f"{name} must be -1 (no limit) or in [0, {INT32_MAX}], got {budget}")
    return budget


def _check_end_tags(name: str, value: object) -> tuple[str | tuple[int, ...], ...]:
    ends = (value,) if isinstance(value, str) or not isinstance(value, Iterable) else value
    # empty tags are skipped, as llama-server does
    return tuple(t for t in (_tag(name, e) for e in ends) if t)


def _check_forced(name: str, value: object) -> tuple[int, ...] | None:
    return None if value is None else _token_list(name, value)


def _read_dry_base(value: object, default: float) -> float:
    x = json_float(value)
    return x if x >= 1.0 else default  # llama-server: a base below 1 is replaced by the server's default


def _read_breakers(value: object, default: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise ValueError("Error: dry_sequence_breakers must be a non-empty array of strings")
    return tuple(value)


def _read_samplers(value: object, default: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return parse_sampler_chars(value)
    if isinstance(value, list):
        return parse_sampler_names(value)
    raise ValueError("must be an array of names or a string of one-letter codes")


_STRTOL_ID = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _read_logit_bias(value: object, default: object) -> tuple[tuple[int | str, float], ...]:
    """llama-server's forms, ``[[token_or_text, bias_or_false], ...]`` or ``{"token_or_text": bias_or_false}``,
    where an object key that strtol reads whole is an id (``""`` is 0). Anything malformed (not a pair, a bias
    that is not a number or false, a negative id, neither form) is an error, where llama-server skips it."""
    if isinstance(value, Mapping):
        def key(token: object) -> object:
            if isinstance(token, str):
                m = _STRTOL_ID.fullmatch(token)
                return int(m.group(1)) if m else 0 if token == "" else token
            return token
        value = [(key(token), bias) for token, bias in value.items()]
    return _parse_logit_bias(value)


def _read_json_schema(value: object, default: object) -> Any:
    if not isinstance(value, (dict, bool)):
        raise ValueError("must be an object")
    return value


def _read_array(value: object, default: object) -> tuple:
    if not isinstance(value, list):
        raise ValueError("must be an array")
    return tuple(value)


def _read_end_tags(value: object, default: object) -> object:
    if not isinstance(value, (str, list)):  # reasoning_budget_end_tag: one tag
        raise ValueError("must be an array of strings (or one string)")
    return value


def _breakers_from_args(args: Any) -> tuple[str, ...]:
    """``--dry-sequence-breaker``: the first use replaces the defaults; ``none`` clears them."""
    if args.dry_sequence_breaker is None:
        return DEFAULT_SEQ_BREAKERS
    given = [unescape(b) for b in args.dry_sequence_breaker]
    return () if given == ["none"] else tuple(given)


def _samplers_from_args(args: Any) -> tuple[str, ...]:
    if args.samplers is not None:
        return parse_sampler_names(args.samplers)
    if args.sampler_seq is not None:
        return parse_sampler_chars(args.sampler_seq)
    return DEFAULT_SAMPLERS


def _one_constraint(args: Any) -> None:
    """At most one of the grammar / JSON-schema flags."""
    flags = [f for d in declarations(SamplingParams) for f in d.cli if f.group == "constraints"]
    given = [next(n for n in f.names if n.startswith("--")) for f in flags if getattr(args, f.dest) is not None]
    if len(given) > 1:
        raise ValueError(f"use only one of {', '.join(given)}")


def _grammar_from_args(args: Any) -> str:
    _one_constraint(args)
    if args.grammar_file is not None:
        return read_text_file(args.grammar_file, "grammar file")
    return args.grammar if args.grammar is not None else ""


def _json_schema_from_args(args: Any) -> str | None:
    if args.json_schema_file is not None:
        return read_text_file(args.json_schema_file, "JSON schema file")
    return args.json_schema


def _thinking(args: Any) -> bool:
    """The reasoning-budget flags are in use: the tags are the common ``<think>`` ones (llama.cpp takes them
    from the chat template's thinking markers)."""
    return args.reasoning_budget >= 0 or bool(args.reasoning_budget_message)


@dataclass
class SamplingParams:
    """Every llama.cpp sampling parameter with its default; field names are llama-server's request fields.

    Each field is declared once, with :func:`~samplechain.param_specs.param`: default, validation, llama-server's
    names and rule (spec/server §4), command-line flags (spec/samplers §6.2). Validation, ``from_dict``, the CLI
    flags and the server's request parsing are all generated from these declarations.
    """

    seed: int = param(DEFAULT_SEED, check=lambda n, v: check_seed(v), json=plain(int),
                      cli=[flag("-s", "--seed", type=cli_seed, help="RNG seed (-1 = random)")])
    n_prev: int = param(64, check=integer(0), json=hard(0, INT32_MAX), server=False,
                        from_args=lambda a: max(64, a.repeat_last_n))  # --repeat-last-n raises the history size
    n_probs: int = param(0, check=integer(0), json=soft(0, INT32_MAX, int), aliases=["logprobs"])
    min_keep: int = param(0, check=integer(0), json=hard(0, INT32_MAX))
    top_k: int = param(40, check=integer(), json=soft(0, INT32_MAX, int), cli=[flag("--top-k", type=int)])
    top_p: float = param(0.95, check=number, json=soft(0.0, 1.0), cli=[flag("--top-p", type=cli_number)])
    min_p: float = param(0.05, check=number, json=soft(0.0, 1.0), cli=[flag("--min-p", type=cli_number)])
    xtc_probability: float = param(0.0, check=number, json=soft(0.0, 1.0),
                                   cli=[flag("--xtc-probability", type=cli_number)])
    xtc_threshold: float = param(0.10, check=number, json=soft(0.0, 1.0),
                                 cli=[flag("--xtc-threshold", type=cli_number)])
    typical_p: float = param(1.0, check=number, json=plain(float), common_names=["typ_p"],
                             cli=[flag("--typical", "--typical-p", dest="typical", type=cli_number)])
    temperature: float = param(0.80, check=number, json=soft(0.0, math.inf), common_names=["temp"],
                               cli=[flag("--temp", "--temperature", dest="temp", type=cli_number)],
                               from_args=lambda a: max(0.0, a.temp))  # the CLI clamps --temp to >= 0
    dynatemp_range: float = param(0.0, check=number, json=plain(float), cli=[flag("--dynatemp-range", type=cli_number)])
    dynatemp_exponent: float = param(1.0, check=number, json=plain(float),
                                     cli=[flag("--dynatemp-exp", type=cli_number)])
    repeat_last_n: int = param(64, check=integer(0), json=hard(0, INT32_MAX), common_names=["penalty_last_n"],
                               cli=[flag("--repeat-last-n", type=int)],
                               from_args=at_least("repeat_last_n", "--repeat-last-n", 0))
    repeat_penalty: float = param(1.0, check=_check_repeat_penalty, json=plain(float),
                                  common_names=["penalty_repeat"], cli=[flag("--repeat-penalty", type=cli_number)])
    frequency_penalty: float = param(0.0, check=number, json=plain(float), common_names=["penalty_freq"],
                                     cli=[flag("--frequency-penalty", type=cli_number)])
    presence_penalty: float = param(0.0, check=number, json=plain(float), common_names=["penalty_present"],
                                    cli=[flag("--presence-penalty", type=cli_number)])
    dry_multiplier: float = param(0.0, check=number, json=plain(float), cli=[flag("--dry-multiplier", type=cli_number)])
    dry_base: float = param(1.75, check=number, json=custom(_read_dry_base), cli=[flag("--dry-base", type=cli_number)])
    dry_allowed_length: int = param(2, check=integer(0), json=hard(0, INT32_MAX),
                                    cli=[flag("--dry-allowed-length", type=int)])
    dry_penalty_last_n: int = param(64, check=integer(0), json=hard(0, INT32_MAX),
                                    cli=[flag("--dry-penalty-last-n", type=int)],
                                    from_args=at_least("dry_penalty_last_n", "--dry-penalty-last-n", 0))
    dry_sequence_breakers: tuple[str, ...] = param(
        DEFAULT_SEQ_BREAKERS, check=_check_breakers, json=custom(_read_breakers),
        cli=[flag("--dry-sequence-breaker", action="append", default=None,
                  help="repeatable; the first use replaces the defaults; 'none' clears them")],
        from_args=_breakers_from_args)
    adaptive_target: float = param(-1.0, check=number, json=soft(-math.inf, 1.0),
                                   cli=[flag("--adaptive-target", type=cli_number)])
    adaptive_decay: float = param(0.90, check=_check_decay, json=hard(0.0, 0.99, float),
                                  cli=[flag("--adaptive-decay", type=cli_number)])
    mirostat: int = param(0, check=_check_mirostat, json=soft(0, 2, int),
                          cli=[flag("--mirostat", type=int, choices=(0, 1, 2))])
    top_n_sigma: float = param(-1.0, check=number, json=plain(float),
                               cli=[flag("--top-nsigma", "--top-n-sigma", dest="top_n_sigma", type=cli_number)])
    mirostat_tau: float = param(5.0, check=number, json=plain(float), cli=[flag("--mirostat-ent", type=cli_number)])
    mirostat_eta: float = param(0.1, check=number, json=plain(float), cli=[flag("--mirostat-lr", type=cli_number)])
    ignore_eos: bool = param(False, check=boolean, json=plain(bool),
                             cli=[flag("--ignore-eos", action="store_true",
                                       help="never stop at end-of-generation tokens")])
    no_perf: bool = param(False, check=boolean, json=plain(bool), server=False,
                          cli=[flag("--perf", dest="perf", action="store_true", default=True,
                                    help="print timings (default)"),
                               flag("--no-perf", dest="perf", action="store_false")],
                          from_args=lambda a: not a.perf)
    post_sampling_probs: bool = param(False, check=boolean, json=plain(bool))
    backend_sampling: bool = param(
        False, check=boolean, json=plain(bool),
        cli=[flag("-bs", "--backend-sampling", action="store_true",
                  help="run the chain's leading samplers on the model's device (the final draw on the CPU)")],
        from_args=lambda a: a.backend_sampling or a.backend_dist)
    # with backend_sampling: the final draw on the device too (else on the CPU)
    backend_dist: bool = param(
        False, check=boolean, json=plain(bool), server=False,
        cli=[flag("--backend-dist", action="store_true",
                  help="with backend sampling, draw the token on the device too (implies --backend-sampling)")])
    samplers: tuple[str, ...] = param(
        DEFAULT_SAMPLERS, check=lambda n, v: parse_sampler_names(v), json=custom(_read_samplers),
        cli=[flag("--samplers", default=None,
                  help=f"';'-separated sampler names (default {';'.join(DEFAULT_SAMPLERS)})"),
             flag("--sampler-seq", "--sampling-seq", dest="sampler_seq", default=None,
                  help=f"samplers as one letter each (default {sampler_chars(DEFAULT_SAMPLERS)})")],
        from_args=_samplers_from_args)
    logit_bias: tuple[tuple[int | str, float], ...] = param(
        (), check=lambda n, v: _parse_logit_bias(v), json=custom(_read_logit_bias, strict=lambda v, d: v),
        cli=[flag("-l", "--logit-bias", type=cli_logit_bias, action="append", default=[])],
        from_args=lambda a: tuple(a.logit_bias))
    grammar: str = param(
        "", check=_check_grammar, json=plain(str),
        cli=[flag("--grammar", default=None, help="GBNF grammar the output must follow", group="constraints"),
             flag("--grammar-file", default=None, help="read the GBNF grammar from a file", group="constraints")],
        from_args=_grammar_from_args)
    # a schema (dict) or its JSON text; wins over ``grammar`` (llama-server uses it only without ``grammar``)
    json_schema: dict[str, Any] | str | bool | None = param(  # noqa: RUF009 (param() is a dataclasses.field)
        None, check=_check_json_schema, json=custom(_read_json_schema),
        cli=[flag("-j", "--json-schema", default=None, group="constraints",
                  help='JSON Schema the output must follow, e.g. \'{"type": "object"}\' ({} = any JSON value)'),
             flag("-jf", "--json-schema-file", default=None, help="read the JSON Schema from a file",
                  group="constraints")],
        from_args=_json_schema_from_args)
    grammar_lazy: bool = param(False, check=boolean, json=plain(bool))
    grammar_triggers: tuple[tuple[int, str, int | None], ...] = param(  # (type, value, token); TRIGGER_* types
        (), check=lambda n, v: tuple(_parse_trigger(t) for t in v), json=custom(_read_array))
    preserved_tokens: tuple[str, ...] = param((), check=_check_preserved, json=custom(_read_array))
    # the assistant prefix the chat template already put in the prompt; fed to the reasoning budget, so a prompt
    # ending in a start tag opens the thinking block (llama.cpp also feeds it to output-format grammars)
    generation_prompt: str = param("", check=text, json=plain(str))
    # reasoning budget (spec/samplers §3.19, §5.10); tags are texts (tokenized with special tokens) or token ids
    reasoning_budget_tokens: int = param(  # tokens allowed inside a thinking block; -1 = no limit
        -1, check=_check_budget, json=hard(-1, INT32_MAX), aliases=["thinking_budget_tokens"],
        cli=[flag("--reasoning-budget", type=cli_budget,
                  help="tokens allowed inside a <think> ... </think> block (-1 = no limit, 0 = none)")])
    reasoning_budget_start_tag: str | tuple[int, ...] = param(
        "", check=lambda n, v: _tag(n, v), json=custom(lambda v, d: v), common_names=["reasoning_budget_start"],
        from_args=lambda a: "<think>" if _thinking(a) else "")
    reasoning_budget_end_tags: tuple[str | tuple[int, ...], ...] = param(  # the first one closes a forced block
        (), check=_check_end_tags, json=custom(_read_end_tags), aliases=["reasoning_budget_end_tag"],
        common_names=["reasoning_budget_end"], from_args=lambda a: ("</think>",) if _thinking(a) else ())
    reasoning_budget_message: str = param(  # forced before the first end tag when the budget is spent
        "", check=text, json=plain(str),
        cli=[flag("--reasoning-budget-message", help="text forced before </think> when the reasoning budget is spent")])
    reasoning_budget_forced: tuple[int, ...] | None = param(  # token ids forced instead of message + first end tag
        None, check=_check_forced, json=custom(lambda v, d: v), server=False)
    # keep a budget sampler even without a limit, so force_reasoning_end() works
    reasoning_control: bool = param(False, check=boolean, json=plain(bool))

    def __post_init__(self) -> None:
        for d in declarations(type(self)):
            setattr(self, d.name, d.check(d.name, getattr(self, d.name)))

    # --- server request fields ---------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Parameters from a llama-server request body (sampling fields only; ``null`` = absent).

        Reads the fields as the server does (its names, then llama.cpp's ``common_params_sampling`` names;
        clamps where it clamps), but strictly: unknown fields and invalid values raise ``ValueError`` naming the
        field. The server itself uses ``samplechain.server.sampling_fields``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"sampling parameters must be a JSON object, got {type(data).__name__}")
        decls = declarations(cls)
        known = {name for d in decls for name in d.dict_names}
        for key in data:
            if key not in known:
                raise ValueError(f"unknown sampling parameter {key!r}")
        kwargs: dict[str, Any] = {}
        for d in decls:
            found = first_present(data, d.dict_names)
            if found is not None:
                try:
                    kwargs[d.name] = d.read_json(found[1], d.default, strict=True)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"Field '{found[0]}': {e}") from None
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
