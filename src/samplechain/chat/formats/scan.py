"""Small pieces the agent formats' parsers and grammars share: a literal expected next in a streamed text, a JSON
argument object as far as it goes, code wrapped as ``{"code": ...}`` arguments (llama.cpp's
``wrap_code_as_arguments``) and a GBNF rule for text without a closing tag (``make_gbnf_excluding``)."""

from __future__ import annotations

import json

from samplechain.chat.json_scan import Invalid, raw, skip_ws, value_end


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
