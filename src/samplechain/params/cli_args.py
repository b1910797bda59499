"""The ``SamplingParams`` fields that several command-line flags make, or that the CLI reads by rules of its own
(the declarations' ``from_args``; llama.cpp's flags are in common/arg.cpp)."""

from __future__ import annotations

from typing import Any

from samplechain.param_specs import read_text_file, unescape
from samplechain.params.sampler_names import DEFAULT_SAMPLERS, parse_sampler_chars, parse_sampler_names
from samplechain.samplers.dry import DEFAULT_SEQ_BREAKERS


def breakers_from_args(args: Any) -> tuple[str, ...]:
    """``--dry-sequence-breaker``: the first use replaces the defaults; ``none`` clears them."""
    if args.dry_sequence_breaker is None:
        return DEFAULT_SEQ_BREAKERS
    given = [unescape(b) for b in args.dry_sequence_breaker]
    return () if given == ["none"] else tuple(given)


def samplers_from_args(args: Any) -> tuple[str, ...]:
    if args.samplers is not None:
        return parse_sampler_names(args.samplers)
    if args.sampler_seq is not None:
        return parse_sampler_chars(args.sampler_seq)
    return DEFAULT_SAMPLERS


def grammar_from_args(args: Any) -> str:
    if args.grammar_file is not None:
        return read_text_file(args.grammar_file, "grammar file")
    return args.grammar if args.grammar is not None else ""


def json_schema_from_args(args: Any) -> str | None:
    if args.json_schema_file is not None:
        return read_text_file(args.json_schema_file, "JSON schema file")
    return args.json_schema


def thinking(args: Any) -> bool:
    """The reasoning-budget flags are in use: the tags are the common ``<think>`` ones (llama.cpp takes them
    from the chat template's thinking markers)."""
    return args.reasoning_budget >= 0 or bool(args.reasoning_budget_message)
