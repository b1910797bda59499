"""``SamplingParams``: llama.cpp's ``common_params_sampling`` with llama-server's request fields, every field
declared once (``samplechain.param_specs``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from samplechain.param_specs import (
    at_least,
    cli_logit_bias,
    custom,
    declarations,
    flag,
    hard,
    param,
    plain,
    soft,
)
from samplechain.params.checks import (
    check_breakers,
    check_budget,
    check_decay,
    check_end_tags,
    check_forced,
    check_grammar,
    check_json_schema,
    check_mirostat,
    check_preserved,
    check_repeat_penalty,
    parse_logit_bias,
    parse_tag,
    parse_trigger,
)
from samplechain.params.cli_args import (
    breakers_from_args,
    grammar_from_args,
    json_schema_from_args,
    samplers_from_args,
    thinking,
)
from samplechain.params.sampler_names import DEFAULT_SAMPLERS, parse_sampler_names, sampler_chars
from samplechain.params.server_json import (
    read_array,
    read_breakers,
    read_dry_base,
    read_end_tags,
    read_json_schema,
    read_logit_bias,
    read_samplers,
)
from samplechain.rng import DEFAULT_SEED, check_seed
from samplechain.samplers.dry import DEFAULT_SEQ_BREAKERS
from samplechain.validate import (
    INT32_MAX,
    check_bool,
    check_number,
    check_text,
    cli_budget,
    cli_number,
    cli_seed,
    first_present,
    int_check,
)


@dataclass
class SamplingParams:
    """Every llama.cpp sampling parameter with its default; field names are llama-server's request fields.

    Each field is declared once, with :func:`~samplechain.param_specs.param`: default, validation, llama-server's
    names and rule (tools/server/server-schema.cpp), command-line flags (common/arg.cpp). Validation,
    ``from_dict``, the CLI flags and the server's request parsing are all generated from these declarations.
    """

    seed: int = param(DEFAULT_SEED, check=lambda n, v: check_seed(v), json=plain(int),
                      cli=[flag("-s", "--seed", type=cli_seed, shown_default="-1",
                                help="RNG seed (-1 = a random one; the seed used is printed at start)")])
    n_prev: int = param(64, check=int_check(0), json=hard(0, INT32_MAX), server=False,
                        from_args=lambda a: max(64, a.repeat_last_n))  # --repeat-last-n raises the history size
    n_probs: int = param(0, check=int_check(0), json=soft(0, INT32_MAX, int), aliases=["logprobs"])
    min_keep: int = param(0, check=int_check(0), json=hard(0, INT32_MAX))
    top_k: int = param(40, check=int_check(), json=soft(0, INT32_MAX, int),
                       cli=[flag("--top-k", type=int, help="keep the K most likely tokens (0 = off)")])
    top_p: float = param(0.95, check=check_number, json=soft(0.0, 1.0),
                         cli=[flag("--top-p", type=cli_number,
                                   help="keep the most likely tokens up to this total probability (1.0 = off)")])
    min_p: float = param(0.05, check=check_number, json=soft(0.0, 1.0),
                         cli=[flag("--min-p", type=cli_number,
                                   help="drop tokens below this fraction of the top token's probability (0.0 = off)")])
    xtc_probability: float = param(0.0, check=check_number, json=soft(0.0, 1.0),
                                   cli=[flag("--xtc-probability", type=cli_number,
                                             help="XTC: chance per step of removing the top choices (0.0 = off)")])
    xtc_threshold: float = param(0.10, check=check_number, json=soft(0.0, 1.0),
                                 cli=[flag("--xtc-threshold", type=cli_number,
                                           help="XTC: the tokens above this probability, all but the least likely, "
                                                "are removed")])
    typical_p: float = param(1.0, check=check_number, json=plain(float), common_names=["typ_p"],
                             cli=[flag("--typical", "--typical-p", dest="typical", type=cli_number,
                                       help="locally typical sampling, parameter p (1.0 = off)")])
    temperature: float = param(0.80, check=check_number, json=soft(0.0, math.inf), common_names=["temp"],
                               cli=[flag("--temp", "--temperature", dest="temp", type=cli_number,
                                         help="temperature: divides the logits; <= 0 picks the most likely token")],
                               from_args=lambda a: max(0.0, a.temp))  # the CLI clamps --temp to >= 0
    dynatemp_range: float = param(0.0, check=check_number, json=plain(float),
                                  cli=[flag("--dynatemp-range", type=cli_number,
                                            help="dynamic temperature: temp +/- this, by the entropy (0.0 = off)")])
    dynatemp_exponent: float = param(1.0, check=check_number, json=plain(float),
                                     cli=[flag("--dynatemp-exp", type=cli_number, help="dynamic temperature exponent")])
    repeat_last_n: int = param(64, check=int_check(0), json=hard(0, INT32_MAX), common_names=["penalty_last_n"],
                               cli=[flag("--repeat-last-n", type=int,
                                         help="last N tokens the repetition penalties look at (0 = off)")],
                               from_args=at_least("repeat_last_n", "--repeat-last-n", 0))
    repeat_penalty: float = param(1.0, check=check_repeat_penalty, json=plain(float), common_names=["penalty_repeat"],
                                  cli=[flag("--repeat-penalty", type=cli_number,
                                            help="divide repeated tokens' positive logits by this (1.0 = off)")])
    frequency_penalty: float = param(0.0, check=check_number, json=plain(float), common_names=["penalty_freq"],
                                     cli=[flag("--frequency-penalty", type=cli_number,
                                               help="subtract this times a token's count in the last N (0.0 = off)")])
    presence_penalty: float = param(0.0, check=check_number, json=plain(float), common_names=["penalty_present"],
                                    cli=[flag("--presence-penalty", type=cli_number,
                                              help="subtract this from every token seen in the last N (0.0 = off)")])
    dry_multiplier: float = param(0.0, check=check_number, json=plain(float),
                                  cli=[flag("--dry-multiplier", type=cli_number,
                                            help="DRY: penalize tokens that extend a repeated sequence (0.0 = off)")])
    dry_base: float = param(1.75, check=check_number, json=custom(read_dry_base),
                            cli=[flag("--dry-base", type=cli_number,
                                      help="DRY: penalty base, raised to the repeat's excess length")])
    dry_allowed_length: int = param(2, check=int_check(0), json=hard(0, INT32_MAX),
                                    cli=[flag("--dry-allowed-length", type=int,
                                              help="DRY: repeats up to this long are not penalized")])
    dry_penalty_last_n: int = param(64, check=int_check(0), json=hard(0, INT32_MAX),
                                    cli=[flag("--dry-penalty-last-n", type=int,
                                              help="DRY: last N tokens searched for repeats (0 = off)")],
                                    from_args=at_least("dry_penalty_last_n", "--dry-penalty-last-n", 0))
    dry_sequence_breakers: tuple[str, ...] = param(
        DEFAULT_SEQ_BREAKERS, check=check_breakers, json=custom(read_breakers),
        cli=[flag("--dry-sequence-breaker", action="append", default=None,
                  shown_default=", ".join(map(repr, DEFAULT_SEQ_BREAKERS)),
                  help="DRY: text that ends a repeat (repeatable; the first use replaces the defaults, 'none' "
                       "clears them)")],
        from_args=breakers_from_args)
    adaptive_target: float = param(-1.0, check=check_number, json=soft(-math.inf, 1.0),
                                   cli=[flag("--adaptive-target", type=cli_number,
                                             help="adaptive-p: select tokens near this probability (negative = off)")])
    adaptive_decay: float = param(0.90, check=check_decay, json=hard(0.0, 0.99, float),
                                  cli=[flag("--adaptive-decay", type=cli_number,
                                            help="adaptive-p: decay of the target's adaptation (0.0 to 0.99)")])
    mirostat: int = param(0, check=check_mirostat, json=soft(0, 2, int),
                          cli=[flag("--mirostat", type=int, choices=(0, 1, 2),
                                    help="Mirostat: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replaces the chain)")])
    top_n_sigma: float = param(-1.0, check=check_number, json=plain(float),
                               cli=[flag("--top-nsigma", "--top-n-sigma", dest="top_n_sigma", type=cli_number,
                                         help="keep tokens within N standard deviations of the top logit (-1 = off)")])
    mirostat_tau: float = param(5.0, check=check_number, json=plain(float), cli=[flag("--mirostat-ent", type=cli_number,
                                                                  help="Mirostat target entropy, parameter tau")])
    mirostat_eta: float = param(0.1, check=check_number, json=plain(float), cli=[flag("--mirostat-lr", type=cli_number,
                                                                 help="Mirostat learning rate, parameter eta")])
    ignore_eos: bool = param(False, check=check_bool, json=plain(bool),
                             cli=[flag("--ignore-eos", action="store_true",
                                       help="never stop at end-of-generation tokens")])
    no_perf: bool = param(False, check=check_bool, json=plain(bool), server=False,
                          cli=[flag("--perf", dest="perf", action="store_true", default=True,
                                    help="print the timings at the end"),
                               flag("--no-perf", dest="perf", action="store_false", help="do not print them")],
                          from_args=lambda a: not a.perf)
    post_sampling_probs: bool = param(False, check=check_bool, json=plain(bool))
    backend_sampling: bool = param(
        False, check=check_bool, json=plain(bool),
        cli=[flag("-bs", "--backend-sampling", action="store_true",
                  help="run the chain's leading samplers on the model's device (the final draw on the CPU)")],
        from_args=lambda a: a.backend_sampling or a.backend_dist)
    # with backend_sampling: the final draw on the device too (else on the CPU)
    backend_dist: bool = param(
        False, check=check_bool, json=plain(bool), server=False,
        cli=[flag("--backend-dist", action="store_true",
                  help="with backend sampling, draw the token on the device too (implies --backend-sampling)")])
    samplers: tuple[str, ...] = param(
        DEFAULT_SAMPLERS, check=lambda n, v: parse_sampler_names(v), json=custom(read_samplers),
        cli=[flag("--samplers", default=None, help="the chain: sampler names in order, ';'-separated"),
             flag("--sampler-seq", "--sampling-seq", dest="sampler_seq", default=None,
                  shown_default=sampler_chars(DEFAULT_SAMPLERS), help="the chain as one letter per sampler")],
        from_args=samplers_from_args)
    logit_bias: tuple[tuple[int | str, float], ...] = param(
        (), check=lambda n, v: parse_logit_bias(v), json=custom(read_logit_bias, strict=lambda v, d: v),
        cli=[flag("-l", "--logit-bias", type=cli_logit_bias, action="append", default=[],
                  help="TOKEN_ID(+/-)BIAS: add BIAS to a token's logit, e.g. 15043+1 or 2-inf (repeatable)")],
        from_args=lambda a: tuple(a.logit_bias))
    grammar: str = param(
        "", check=check_grammar, json=plain(str),
        cli=[flag("--grammar", default=None, help="GBNF grammar the output must follow", group="constraints"),
             flag("--grammar-file", default=None, help="read the GBNF grammar from a file", group="constraints")],
        from_args=grammar_from_args)
    # a schema (dict) or its JSON text; wins over ``grammar`` (llama-server uses it only without ``grammar``)
    json_schema: dict[str, Any] | str | bool | None = param(  # noqa: RUF009 (param() is a dataclasses.field)
        None, check=check_json_schema, json=custom(read_json_schema),
        cli=[flag("-j", "--json-schema", default=None, group="constraints",
                  help='JSON Schema the output must follow, e.g. \'{"type": "object"}\' ({} = any JSON value)'),
             flag("-jf", "--json-schema-file", default=None, help="read the JSON Schema from a file",
                  group="constraints")],
        from_args=json_schema_from_args)
    grammar_lazy: bool = param(False, check=check_bool, json=plain(bool))
    grammar_triggers: tuple[tuple[int, str, int | None], ...] = param(  # (type, value, token); TRIGGER_* types
        (), check=lambda n, v: tuple(parse_trigger(t) for t in v), json=custom(read_array))
    preserved_tokens: tuple[str, ...] = param((), check=check_preserved, json=custom(read_array))
    # the assistant prefix the chat template already put in the prompt; fed to the reasoning budget, so a prompt
    # ending in a start tag opens the thinking block (llama.cpp also feeds it to output-format grammars)
    generation_prompt: str = param("", check=check_text, json=plain(str))
    # reasoning budget (common/reasoning-budget.cpp); tags are texts (tokenized with special tokens) or token ids
    reasoning_budget_tokens: int = param(  # tokens allowed inside a thinking block; -1 = no limit
        -1, check=check_budget, json=hard(-1, INT32_MAX), aliases=["thinking_budget_tokens"],
        cli=[flag("--reasoning-budget", type=cli_budget,
                  help="tokens allowed inside a <think> ... </think> block (-1 = no limit, 0 = none)")])
    reasoning_budget_start_tag: str | tuple[int, ...] = param(
        "", check=parse_tag, json=custom(lambda v, d: v), common_names=["reasoning_budget_start"],
        from_args=lambda a: "<think>" if thinking(a) else "")
    reasoning_budget_end_tags: tuple[str | tuple[int, ...], ...] = param(  # the first one closes a forced block
        (), check=check_end_tags, json=custom(read_end_tags), aliases=["reasoning_budget_end_tag"],
        common_names=["reasoning_budget_end"], from_args=lambda a: ("</think>",) if thinking(a) else ())
    reasoning_budget_message: str = param(  # forced before the first end tag when the budget is spent
        "", check=check_text, json=plain(str),
        cli=[flag("--reasoning-budget-message", help="text forced before </think> when the reasoning budget is spent")])
    reasoning_budget_forced: tuple[int, ...] | None = param(  # token ids forced instead of message + first end tag
        None, check=check_forced, json=custom(lambda v, d: v), server=False)
    # keep a budget sampler even without a limit, so force_reasoning_end() works
    reasoning_control: bool = param(False, check=check_bool, json=plain(bool))

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

