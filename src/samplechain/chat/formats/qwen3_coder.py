"""Qwen3-Coder's XML tool calls (``common_chat_params_init_qwen3_coder_xml``, ``build_grammar_xml_tool_call`` and
``parse_xml_tool_calls``): ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n
</tool_call>``. A string parameter's value is the raw text; the others are JSON; the arguments are one JSON object."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import gbnf_excluding, partial_suffix
from samplechain.chat.json_scan import Invalid, held_back, skip_ws
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_WORD

QWEN3_CODER_XML = "Qwen3 Coder"

SCOPE_START, TOOL_START, TOOL_SEP = "<tool_call>\n", "<function=", ">\n"
KEY_START, KEY_VAL_SEP, VAL_END = "<parameter=", ">\n", "\n</parameter>\n"
TOOL_END, SCOPE_END = "</function>\n", "</tool_call>"
PRESERVED = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")


class Qwen3Coder(Format):
    """The template writes ``<tool_call>``, ``<function=``, ``<parameter=`` and lists the tools as
    ``<function>``/``<parameters>`` (llama.cpp's check; with ``<think>`` it would be Nemotron 3 instead)."""

    name: ClassVar[str] = QWEN3_CODER_XML

    @classmethod
    def matches(cls, source: str) -> bool:
        return (all(s in source for s in ("<tool_call>", "<function>", "<function=", "<parameters>", "<parameter="))
                and "<think>" not in source)

    def params(self, setup: ToolSetup) -> FormatParams:
        return _qwen3_coder(setup)

    def parse(self, text: str, final: bool) -> ChatMessage:
        strings = self.syntax.string_args if self.syntax is not None else frozenset()
        return _parse_xml(text, final, strings)


def _qwen3_coder(setup: ToolSetup) -> FormatParams:
    """One ``<tool_call>`` with one of the functions; each property in the schema's order (optional ones may be left
    out), a string property's value any text without ``\\n</parameter>\\n`` (or a JSON string), the others JSON."""
    b = GrammarBuilder()
    lit = b.literal
    rules = []
    for name, params in tool_names(setup.request.tools):
        props: dict[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or ())
        parts = []
        for key, value in props.items():
            schema = b.add_schema(f"{name}-arg-{key}", value, params)
            val = _string_value(b, f"{name}-arg-{key}", value, schema)
            part = f"{lit(KEY_START)} {lit(key)} {lit(KEY_VAL_SEP)} {val} {lit(VAL_END)}"
            parts.append(part if key in required else f"( {part} )?")
        rules.append(b.add_rule(f"{name}-call", f"{lit(TOOL_START)} {lit(name)} {lit(TOOL_SEP)} "
                                + " ".join(parts) + f" {lit(TOOL_END)}"))
    b.add_rule("string-arg-val", gbnf_excluding(VAL_END))
    b.add_rule("root", f"{lit(SCOPE_START)} ( {' | '.join(rules)} ) {lit(SCOPE_END)}")
    return FormatParams(QWEN3_CODER_XML, True, b.text(), not setup.required,
                        ((TRIGGER_WORD, SCOPE_START + TOOL_START),), PRESERVED)


_FREE_STRING_KEYS = frozenset({"type", "description", "title", "default", "examples", "$comment", "nullable"})


def _string_value(b: GrammarBuilder, name: str, schema: Any, json_rule: str) -> str:
    """A parameter value's rule: the JSON value (``json_rule``), or for a string parameter its text as such: any text
    for an unconstrained string (``build_grammar_xml_tool_call``), the values themselves for an ``enum`` / ``const``
    of strings; a string with other constraints (length, pattern, format) only as JSON, where they are enforced."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return json_rule
    if set(schema) <= _FREE_STRING_KEYS:
        return f"( string-arg-val | {json_rule} )"
    values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if isinstance(values, list) and values and all(isinstance(v, str) and "\n" not in v for v in values):
        raw = b.add_rule(f"{name}-text", " | ".join(b.literal(v) for v in values))
        return f"( {raw} | {json_rule} )"
    return json_rule


_OPEN = re.compile(r"<tool_call>\s*<function=")
_OPENERS = ("<tool_call>\n<function=", "<tool_call><function=")
_JSON_START = '"-0123456789[{tfn'
_KEYWORDS = (SCOPE_START, TOOL_START, TOOL_SEP, KEY_START, KEY_VAL_SEP, VAL_END, TOOL_END, SCOPE_END)


def _value(raw: str, string: bool) -> Any:
    """A parameter's value: the text for a string parameter, else JSON when the text is JSON, else the text
    (``parse_xml_tool_calls``, which reads the value by the parameter's schema type)."""
    if string:  # the text itself, or a JSON string the grammar also allows
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            try:
                value = json.loads(raw)
            except ValueError:
                return raw
            return value if isinstance(value, str) else raw
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _dump(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def _parse_xml(text: str, final: bool, strings: frozenset[tuple[str, str]]) -> ChatMessage:
    """Content, then ``<tool_call>`` blocks; a partial call's arguments are its object so far, left open."""
    msg = ChatMessage()
    pos = 0
    while (m := _OPEN.search(text, pos)) is not None:
        msg.content += text[pos:m.start()]
        end = _call(text, m.end(), final, msg, strings)
        if end is None:
            return msg
        pos = skip_ws(text, end)
    rest = text[pos:]
    msg.content += rest if final else rest[:held_back(rest, _OPENERS)]
    return msg


def _call(text: str, pos: int, final: bool, msg: ChatMessage, strings: frozenset[tuple[str, str]]) -> int | None:
    """One call from its name on: appended to ``msg``; where the block ends (None: the text ends inside it)."""
    sep = text.find(">", pos)
    if sep < 0 or "\n" in text[pos:sep]:
        if final or "\n" in text[pos:]:
            raise Invalid("expected a function name")
        return None
    call = ToolCall(text[pos:sep].strip(), "")
    msg.tool_calls.append(call)
    args: dict[str, Any] = {}
    pos = sep + 1
    while True:
        at = _skip(text, pos)
        if text.startswith(KEY_START, at):
            key_end = text.find(">", at + len(KEY_START))
            if key_end < 0:
                return _partial(final, call, args)
            key = text[at + len(KEY_START):key_end]
            start = key_end + 1 + (text[key_end + 1:key_end + 2] == "\n")
            close = text.find(VAL_END.rstrip("\n"), start)
            if close < 0:
                if final:
                    raise Invalid("expected </parameter>")
                value = text[start:]
                value = value[:partial_suffix(value, (VAL_END.rstrip("\n"),))]
                head = _dump(args)[:-1] + (", " if args else "") + json.dumps(key, ensure_ascii=False) + ": "
                # a value that may be JSON waits for its end; other text streams as a string
                body = value.lstrip()
                string = (call.name, key) in strings
                json_like = not body or body[0] in (_JSON_START if not string else '"')  # decided at its end
                call.arguments = head if json_like else \
                    head + json.dumps(value, ensure_ascii=False)[:-1]
                return None
            args[key] = _value(text[start:close], (call.name, key) in strings)
            call.arguments = _dump(args)[:-1]
            pos = close + len(VAL_END.rstrip("\n"))
            continue
        if text.startswith("</function>", at):
            call.arguments = _dump(args)
            after = _skip(text, at + len("</function>"))
            if text.startswith(SCOPE_END, after):
                return after + len(SCOPE_END)
            if final or not SCOPE_END.startswith(text[after:]):
                raise Invalid("expected </tool_call>")
            call.arguments = _dump(args)[:-1]
            return None
        if final or not any(k.lstrip("\n").startswith(text[at:]) for k in _KEYWORDS):
            raise Invalid("expected <parameter= or </function>")
        return _partial(final, call, args)


def _partial(final: bool, call: ToolCall, args: dict[str, Any]) -> None:
    if final:
        raise Invalid("incomplete tool call")
    call.arguments = _dump(args)[:-1]


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
