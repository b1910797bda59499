"""Scanning JSON as it streams in: where a value ends (None: the text ends inside it), an object's members, an
array's items, a tool call written as an object, and how much of a text's end may still open a call. Validation is
``json.loads``'s, on complete values."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from samplechain.chat.messages import ToolCall


class Invalid(ValueError):
    """The output does not have the format's shape (a final parse then keeps it all as content)."""


WS = " \t\n\r"
_SCALAR = re.compile(r"[-+0-9.eEa-zA-Z]+")
_T = TypeVar("_T")


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
        elif s[j] == '"':
            return j + 1
        else:
            j += 1
    return None


def value_end(s: str, i: int, final: bool) -> int | None:
    """Where the JSON value at ``s[i]`` ends (None: the text ends inside it). It finds the end; validation is
    ``json.loads``'s, on complete values."""
    if i >= len(s):
        return None
    if s[i] == '"':
        return string_end(s, i)
    if s[i] in "{[":
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                end = string_end(s, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    m = _SCALAR.match(s, i)
    if m is None:
        raise Invalid(f"not JSON at {s[i:i + 20]!r}")
    return m.end() if final or m.end() < len(s) else None


def _entries(s: str, i: int, close: str, entry: Callable[[int], tuple[_T, int | None] | None],
             ) -> tuple[list[_T], int | None]:
    """The entries of the object or array that opens at ``s[i]``, in order, and where it ends (past ``close``; None:
    the text ends inside it). ``entry(j)`` reads the entry that starts at ``j``: (the entry, where its value ends or
    None), or None when the text ends before its value."""
    out: list[_T] = []
    j = skip_ws(s, i + 1)
    if j < len(s) and s[j] == close:
        return out, j + 1
    while j < len(s):
        found = entry(j)
        if found is None:
            return out, None
        item, end = found
        out.append(item)
        if end is None:
            return out, None
        j = skip_ws(s, end)
        if j < len(s) and s[j] == close:
            return out, j + 1
        if j < len(s) and s[j] != ",":
            raise Invalid(f"expected ',' or '{close}'")
        j = skip_ws(s, j + 1)
    return out, None


def members(s: str, i: int, final: bool) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """The members of the object at ``s[i]``, in order, as (key, value start, value end or None), and where the
    object ends (None: the text ends inside it)."""
    if s[i] != "{":
        raise Invalid("expected a JSON object")

    def member(j: int) -> tuple[tuple[str, int, int | None], int | None] | None:
        if s[j] != '"':
            raise Invalid("expected a key")
        key_end = string_end(s, j)
        if key_end is None:
            return None
        key = json.loads(s[j:key_end])
        j = skip_ws(s, key_end)
        if j >= len(s):
            return None
        if s[j] != ":":
            raise Invalid("expected ':'")
        start = skip_ws(s, j + 1)
        end = value_end(s, start, final)
        return (key, start, end), end

    return _entries(s, i, "}", member)


def items(s: str, i: int, final: bool) -> tuple[list[tuple[int, int | None]], int | None]:
    """The items of the array at ``s[i]`` as (start, end or None), and where the array ends."""
    if s[i] != "[":
        raise Invalid("expected a JSON array")

    def item(j: int) -> tuple[tuple[int, int | None], int | None]:
        end = value_end(s, j, final)
        return (j, end), end

    return _entries(s, i, "]", item)


def string_member(s: str, spans: dict[str, tuple[int, int | None]], key: str) -> str | None:
    """The string value of member ``key`` (None: absent or incomplete)."""
    if key not in spans or spans[key][1] is None:
        return None
    start, end = spans[key]
    value = json.loads(s[start:end])
    if not isinstance(value, str):
        raise Invalid(f"{key} must be a string")
    return value


def raw(s: str, start: int, end: int | None) -> str:
    return s[start:end] if end is not None else s[start:].rstrip(WS)


def call_object(s: str, i: int, final: bool, args_key: str = "arguments") -> tuple[ToolCall | None, int | None]:
    """A call written as an object ``{"name": ..., "arguments": ..., "id": ...}`` at ``s[i]``: the call (None while
    its name is incomplete; its arguments as far as they go) and where the object ends."""
    found, end = members(s, i, final)
    spans = {k: (a, b) for k, a, b in found}
    if end is not None:
        json.loads(s[i:end])  # the whole object is JSON
    name = string_member(s, spans, "name")
    if name is None:
        if end is not None:
            raise Invalid("a tool call needs a name")
        return None, end
    if args_key not in spans:
        if end is not None:
            raise Invalid(f"a tool call needs {args_key}")
        return ToolCall(name, ""), end
    return ToolCall(name, raw(s, *spans[args_key]), string_member(s, spans, "id") or ""), end


def held_back(text: str, openers: Sequence[str]) -> int:
    """Where a possible start of one of ``openers`` begins at the end of ``text`` (len(text): none); whitespace in
    the text is ignored, as the openers' patterns allow it."""
    for k in range(max(0, len(text) - 64), len(text)):
        rest = re.sub(r"\s+", "", text[k:])
        if rest and text[k] not in WS and any(o.startswith(rest) for o in openers):
            return k
    return len(text)


def partial_string(s: str, start: int, end: int | None) -> str:
    """A JSON string's text as far as it goes (a cut escape waits for the rest)."""
    if end is not None:
        return json.loads(s[start:end])
    raw = s[start:]
    for cut in range(len(raw), max(len(raw) - 6, 0), -1):
        try:
            return json.loads(raw[:cut] + '"')
        except ValueError:
            continue
    return ""
