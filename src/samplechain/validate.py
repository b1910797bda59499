"""Every value check in one place: how a value given to samplechain is read and refused.

Three doors lead in, each with its own conventions, and each has its readers here:

- **Python** (``SamplingParams(...)``, the samplers' constructors): strict types. A bool is not a number, NaN is
  refused, and the error names the field: ``check_number``, ``check_int``, ``check_bool``, ``check_text``.
- **JSON request bodies**, read as llama-server reads them (nlohmann::json's conversions: a boolean counts as 0/1,
  an integral float as an integer; tools/server/server-schema.cpp): ``json_int``, ``json_float``, ``json_bool``,
  ``json_str``, and the request fields that are not sampling parameters, ``body_int`` / ``body_bool``.
- **The command line** (argparse ``type=`` functions, llama.cpp's common/arg.cpp): ``cli_number``, ``cli_seed``,
  ``cli_budget``, ``cli_non_negative_int``, ``cli_positive_int``, ``cli_non_negative_number``.

The checks of single parameters (a repeat penalty's finite reciprocal, a grammar trigger's form) are built from
these and stay with the parameters' declarations (``params/checks.py``); the server's size and depth bounds are
``server/limits.py``. This module imports nothing of samplechain, so every layer may use it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

INT32_MAX = 2**31 - 1

Check = Callable[[str, Any], Any]  # (field name, value) -> the value as stored; ValueError naming the field


# --- Python values: strict ------------------------------------------------------------------------------------

def check_number(name: str, value: object, *, finite: bool = True) -> float:
    """A real number (not bool); NaN always rejected, infinities rejected when ``finite``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    if finite and math.isinf(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """An integer (not bool), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_int_range(name: str, value: object, lo: int, hi: int, flag: str = "") -> int:
    """``value`` as an int, refused with ``ValueError`` unless it is an integer (not a bool) in ``lo..hi``;
    ``flag`` names the llama.cpp option whose range this is, for the message."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        where = f" (llama.cpp's {flag} range)" if flag else ""
        raise ValueError(f"{name} must be in {lo}..{hi}{where}, got {v}")
    return v


def int_check(minimum: int | None = None) -> Check:
    """``check_int`` with ``minimum`` as a ``Check`` (a parameter declaration's ``check=``)."""
    return lambda name, value: check_int(name, value, minimum=minimum)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


# --- JSON values as llama-server reads them (nlohmann::json's conversions) -----------------------------------

def json_type(value: object) -> str:
    """A value's JSON type name, as nlohmann::json's errors say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _type_error(expected: str, value: object) -> ValueError:
    return ValueError(f"[json.exception.type_error.302] type must be {expected}, but is {json_type(value)}")


def json_int(value: object) -> int:
    """A JSON number as an integer; booleans count as 0/1 (as in llama-server); 1.5 is refused, not truncated."""
    if isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    raise _type_error("number", value)


def json_float(value: object) -> float:
    """A JSON number as a float; booleans count as 0/1."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    raise _type_error("number", value)


def json_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _type_error("boolean", value)


def json_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise _type_error("string", value)


JSON_READERS: dict[type, Callable[[Any], Any]] = {int: json_int, float: json_float, bool: json_bool, str: json_str}


def first_present(body: Mapping[str, Any], names: Sequence[str]) -> tuple[str, Any] | None:
    """The first of ``names`` present and not null, with its value (llama-server tries aliases in order)."""
    for name in names:
        value = body.get(name)
        if value is not None:
            return name, value
    return None


def body_int(body: Mapping[str, Any], names: Sequence[str], default: int, lo: int = -INT32_MAX - 1,
             hi: int = INT32_MAX) -> int:
    """A request's integer field by the first of its ``names`` given (``default`` when none is): a boolean counts
    as 0/1 and an integral float as its integer; ValueError with the field's name outside [lo, hi]."""
    found = first_present(body, names)
    if found is None:
        return default
    name, value = found
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"Field '{name}': expected an integer, got {json.dumps(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"Field '{name}': Value must be between {lo} <= value <= {hi}, but got {value}")
    return value


def body_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A request's true/false field (``default`` when absent or null); ValueError with the field's name."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"Field '{name}': expected true or false, got {json.dumps(value)}")
    return value


# --- command-line values (argparse ``type=``) -----------------------------------------------------------------

def cli_seed(text: str) -> int:
    """``-s``: read as unsigned, so -1 wraps to 0xFFFFFFFF (random), as llama.cpp does."""
    value = int(text, 0)
    if value < -(2**31) or value >= 2**32:
        raise argparse.ArgumentTypeError(f"seed {text} is out of range")
    return value & 0xFFFFFFFF


def cli_number(text: str) -> float:
    """A float flag value; NaN is refused (the Python API refuses it too)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value:
        raise argparse.ArgumentTypeError("must be a number, got nan")
    return value


def cli_budget(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (no limit) or more, got {value}")
    return value


def _at_least(value: float, minimum: float, text: str) -> Any:
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
    return value


def cli_non_negative_int(text: str) -> int:
    return _at_least(int(text), 0, text)


def cli_positive_int(text: str) -> int:
    return _at_least(int(text), 1, text)


def cli_non_negative_number(text: str) -> float:
    return _at_least(cli_number(text), 0, text)
