"""llama-server's sampling request fields (``make_llama_cmpl_schema`` in
tools/server/server-schema.cpp): a request body read over the server's defaults.

The rules are the declarations on ``SamplingParams`` (``samplechain.param_specs``); this module walks them:
a field's names are tried in order and the first one present and not ``null`` wins; soft limits clamp silently;
hard limits, wrong JSON types and invalid values raise :class:`FieldError` (HTTP 400, ``Field '<name>': ...``).
Fields that are not sampling parameters (``prompt``, ``stream``, ``n_predict``, ``stop``, ...) are ignored here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from samplechain.grammar import json_schema_to_gbnf
from samplechain.param_specs import declarations
from samplechain.params import SamplingParams
from samplechain.validate import first_present


class FieldError(ValueError):
    """An invalid request field: HTTP 400 ``invalid_request_error`` with this message; ``field`` is the name
    the request used (None when no single field is to blame)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def parse_sampling_fields(body: Mapping[str, Any], defaults: SamplingParams, *,
                          n_vocab: int | None = None) -> SamplingParams:
    """The sampling parameters of a request: ``defaults`` (the server's flags) with the body's fields applied.

    ``n_vocab``, when given, drops ``logit_bias`` ids outside the vocabulary, as llama-server does.
    """
    if not isinstance(body, Mapping):
        raise FieldError(f"the request body must be a JSON object, got {type(body).__name__}")
    values: dict[str, Any] = {}
    for d in declarations(type(defaults)):
        found = first_present(body, d.request_names)
        if found is None:
            continue
        name, value = found
        try:
            values[d.name] = d.read_json(value, getattr(defaults, d.name))
        except (TypeError, ValueError) as e:
            raise FieldError(f"Field '{name}': {e}", name) from None
    _grammar_or_schema(values)
    if n_vocab is not None and "logit_bias" in values:
        values["logit_bias"] = tuple((t, b) for t, b in values["logit_bias"] if not isinstance(t, int) or t < n_vocab)
    try:
        return dataclasses.replace(defaults, **values)
    except ValueError as e:  # the fields were checked one by one: this is a rule across fields
        raise FieldError(str(e)) from None


def _grammar_or_schema(values: dict[str, Any]) -> None:
    """llama-server reads ``json_schema`` only when the body has no ``grammar``, and converts it at once (an
    invalid schema is a 400); either one from the request replaces the server's default constraint. An empty
    ``grammar`` keeps the default."""
    if "grammar" in values:
        values.pop("json_schema", None)
        if values["grammar"]:
            values["json_schema"] = None
        else:
            del values["grammar"]
    elif "json_schema" in values:
        try:
            json_schema_to_gbnf(values["json_schema"])
        except Exception as e:  # llama-server maps any conversion failure to this message
            raise FieldError(f"Field 'json_schema': \"json_schema\": {e}", "json_schema") from None
        values["grammar"] = ""
