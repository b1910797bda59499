"""llama-server's rules of their own for some request fields (``custom`` JSON rules; llama-server's are in
tools/server/server-schema.cpp, ``make_llama_cmpl_schema``):
``read(value, server_default)`` -> the value, or ``ValueError`` with llama-server's detail."""

from __future__ import annotations

from typing import Any

from samplechain.params.checks import parse_logit_bias
from samplechain.params.sampler_names import parse_sampler_chars, parse_sampler_names
from samplechain.validate import json_float


def read_dry_base(value: object, default: float) -> float:
    x = json_float(value)
    return x if x >= 1.0 else default  # llama-server: a base below 1 is replaced by the server's default


def read_breakers(value: object, default: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise ValueError("Error: dry_sequence_breakers must be a non-empty array of strings")
    return tuple(value)


def read_samplers(value: object, default: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return parse_sampler_chars(value)
    if isinstance(value, list):
        return parse_sampler_names(value)
    raise ValueError("must be an array of names or a string of one-letter codes")


def read_logit_bias(value: object, default: object) -> tuple[tuple[int | str, float], ...]:
    """llama-server's forms, ``[[token_or_text, bias_or_false], ...]`` or ``{"token_or_text": bias_or_false}``,
    where an object key that strtol reads whole is an id (``""`` is 0)."""
    return parse_logit_bias(value, strtol_keys=True)


def read_json_schema(value: object, default: object) -> Any:
    if not isinstance(value, (dict, bool)):
        raise ValueError("must be an object")
    return value


def read_array(value: object, default: object) -> tuple:
    if not isinstance(value, list):
        raise ValueError("must be an array")
    return tuple(value)


def read_end_tags(value: object, default: object) -> object:
    if not isinstance(value, (str, list)):  # reasoning_budget_end_tag: one tag
        raise ValueError("must be an array of strings (or one string)")
    return value
