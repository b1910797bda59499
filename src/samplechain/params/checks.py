"""How the Python API validates each ``SamplingParams`` field (its ``check``), strictly, and the parsers of the
structured values behind the checks: token-id lists, reasoning tags, grammar triggers and logit biases."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from samplechain.validate import INT32_MAX, check_int, check_number

# --- field checks: (name, value) -> the value as stored; ValueError naming the field ---------------------------


def check_repeat_penalty(name: str, value: object) -> float:
    rp = check_number(name, value)
    if not rp > 0.0 or math.isinf(1.0 / rp):
        raise ValueError(f"{name} must be > 0 with a finite reciprocal, got {rp} (1.0 disables it)")
    return rp


def check_decay(name: str, value: object) -> float:
    decay = check_number(name, value)
    if not 0.0 <= decay <= 0.99:
        raise ValueError(f"{name} must be in [0, 0.99], got {decay}")
    return decay


def check_mirostat(name: str, value: object) -> int:
    mode = check_int(name, value)
    if mode not in (0, 1, 2):
        raise ValueError(f"{name} must be 0 (off), 1 or 2, got {mode}")
    return mode


def check_breakers(name: str, value: object) -> tuple[str, ...]:
    breakers = (value,) if isinstance(value, str) else tuple(value)  # type: ignore[arg-type]
    for b in breakers:
        if not isinstance(b, str):
            raise ValueError(f"{name} must be strings, got {b!r}")
    return breakers


def check_grammar(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be GBNF text, got {type(value).__name__}")
    return value


def check_json_schema(name: str, value: object) -> Any:
    if value is not None and not isinstance(value, (dict, str, bool)):
        raise ValueError(f"{name} must be an object (or its JSON text), got {type(value).__name__}")
    return value


def check_preserved(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(t, str) for t in value):  # type: ignore[attr-defined]
        raise ValueError(f"{name} must be a list of strings")
    return tuple(value)  # type: ignore[arg-type]


def check_budget(name: str, value: object) -> int:
    budget = check_int(name, value)
    if not -1 <= budget <= INT32_MAX:
        raise ValueError(f"{name} must be -1 (no limit) or in [0, {INT32_MAX}], got {budget}")
    return budget


def check_end_tags(name: str, value: object) -> tuple[str | tuple[int, ...], ...]:
    ends = (value,) if isinstance(value, str) or not isinstance(value, Iterable) else value
    # empty tags are skipped, as llama-server does
    return tuple(t for t in (parse_tag(name, e) for e in ends) if t)


def check_forced(name: str, value: object) -> tuple[int, ...] | None:
    return None if value is None else parse_token_list(name, value)


# --- structured values -----------------------------------------------------------------------------------------


def parse_token_list(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of token ids, got {value!r}")
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"{name} must be a list of token ids (integers >= 0), got {t!r}")
        out.append(int(t))
    return tuple(out)


def parse_tag(name: str, value: object) -> str | tuple[int, ...]:
    """A reasoning tag: a text (tokenized later, with the vocabulary) or a list of token ids."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return parse_token_list(name, value)
    raise ValueError(f"{name} must be a text or a list of token ids, got {value!r}")


# grammar trigger types (llama.cpp's common_grammar_trigger_type, common/common.h)
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = range(4)


def parse_trigger(t: object) -> tuple[int, str, int | None]:
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


_STRTOL_ID = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _int_key(token: object) -> object:
    """An object key Python's ``int`` reads is an id; any other text stays a text."""
    if isinstance(token, str):
        try:
            return int(token)
        except ValueError:
            pass
    return token


def _strtol_key(token: object) -> object:
    """llama-server's rule: an object key C's ``strtol`` reads whole is an id, ``""`` is 0."""
    if isinstance(token, str):
        m = _STRTOL_ID.fullmatch(token)
        return int(m.group(1)) if m else 0 if token == "" else token
    return token


def parse_logit_bias(value: object, *, strtol_keys: bool = False) -> tuple[tuple[int | str, float], ...]:
    """``[[token_or_text, bias_or_false], ...]`` or ``{"token_or_text": bias_or_false}``; false = -inf.

    An object key that reads as an integer is a token id: by Python's ``int``, or with ``strtol_keys`` by
    llama-server's rule (``strtol`` reads it whole; ``""`` is 0). Anything malformed (not a pair, a bias that is
    not a number or false, +inf, a negative id, neither form) is an error, where llama-server skips it.
    """
    if isinstance(value, Mapping):
        key = _strtol_key if strtol_keys else _int_key
        items: Iterable = [(key(token), bias) for token, bias in value.items()]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(f"logit_bias must be a list of [token, bias] pairs or an object, got {value!r}")
    out = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"logit_bias entries must be [token, bias] pairs, got {item!r}")
        token, bias = item
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
