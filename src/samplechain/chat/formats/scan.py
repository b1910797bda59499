"""Small pieces the agent formats' parsers and grammars share: a literal expected next in a streamed text, a JSON
argument object as far as it goes, a JSON array of tool calls (its schema, and its calls as far as they go), code
wrapped as ``{"code": ...}`` arguments (llama.cpp's ``wrap_code_as_arguments``) and a GBNF rule for text without a
closing tag (``make_gbnf_excluding``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from samplechain.chat.json_scan import Invalid, call_object, items, raw, skip_ws, value_end
from samplechain.chat.messages import ChatMessage, ToolCall


def expect(text: str, pos: int, literal: str, final: bool, ws: bool = True) -> int | None:
    """Where ``literal`` (after whitespace when ``ws``) ends at ``pos``; None: the text ends inside it (a partial
    text); raises ``Invalid`` when something else is there."""
    at = skip_ws(text, pos) if ws else pos
    if text.startswith(literal, at):
        return at + len(literal)
    if not final and literal.startswith(text[at:]):
        return None
    raise Invalid(f"expected {literal!r}")


def json_args(text: str, start: int, final: bool) -> tuple[str, int | None]:
    """The JSON value at ``text[start]`` (whitespace skipped) as generated, and where it ends (None: the text ends
    inside it; a final text then raises ``Invalid``). A complete value must be JSON."""
    start = skip_ws(text, start)
    if start >= len(text):
        if final:
            raise Invalid("expected JSON arguments")
        return "", None
    end = value_end(text, start, final)
    if end is None:
        if final:
            raise Invalid("incomplete JSON arguments")
        return raw(text, start, None), None
    json.loads(text[start:end])
    return text[start:end], end


def any_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON schema that takes any one of ``schemas``: the one schema itself, or their ``anyOf``."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def calls_array(schemas: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The JSON schema of an array of tool calls, each one of ``schemas``: one call at least, and one at most unless
    ``parallel``."""
    schema: dict[str, Any] = {"type": "array", "items": any_of(schemas), "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def read_calls(text: str, start: int, final: bool, msg: ChatMessage,
               read: Callable[[str, int, bool], tuple[ToolCall | None, int | None]] = call_object) -> int | None:
    """The JSON array of tool calls at ``text[start]`` (whitespace skipped): each call, ``read`` from its object (None
    while its name is incomplete), appended to ``msg``; where the array ends. None: the text ends before or inside the
    array, which a final text may not (``Invalid``)."""
    start = skip_ws(text, start)
    if start >= len(text):
        if final:
            raise Invalid("expected an array of tool calls")
        return None
    calls, end = items(text, start, final)
    for a, _ in calls:
        call, _ = read(text, a, final)
        if call is not None:
            msg.tool_calls.append(call)
    if end is None and final:
        raise Invalid("incomplete tool calls")
    return end


def code_arguments(code: str, final: bool) -> str:
    """Raw code as the arguments ``{"code": ...}`` (``wrap_code_as_arguments``); a partial text leaves the string
    open, so the arguments only grow as the code streams in."""
    dumped = json.dumps({"code": code}, ensure_ascii=False, separators=(",", ":"))
    return dumped if final else dumped[:-2]


def partial_suffix(text: str, literals: tuple[str, ...]) -> int:
    """Where a possible start of one of ``literals`` begins at the end of ``text`` (len(text): none)."""
    for k in range(max(0, len(text) - max(map(len, literals))), len(text)):
        if any(lit.startswith(text[k:]) for lit in literals):
            return k
    return len(text)


def _class_char(c: str) -> str:
    if c in "\\]^-":
        return "\\" + c
    return c if c.isprintable() else f"\\x{ord(c):02X}"


def _quoted_char(c: str) -> str:
    if c == "\\":
        return '"\\\\"'
    if c == '"':
        return '"\\""'
    return f'"{c}"' if c.isprintable() else f'"\\x{ord(c):02X}"'


def gbnf_excluding(forbidden: str) -> str:
    """A GBNF expression for any text that does not contain ``forbidden`` (llama.cpp's ``make_gbnf_excluding`` for
    one string)."""

    def build(depth: int) -> str:
        if depth >= len(forbidden) - 1:
            return f"( [^{_class_char(forbidden[depth])}] )" if depth == len(forbidden) - 1 else ""
        c = forbidden[depth]
        child = build(depth + 1)
        return f"( [^{_class_char(c)}] | {_quoted_char(c)} {child} )"

    return build(0) + "*"
