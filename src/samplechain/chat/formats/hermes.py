"""Hermes 2 Pro's tool calls (``common_chat_params_init_hermes_2_pro``; Hermes 2/3, Qwen 2.5, Qwen 3: the template
writes ``<tool_call>``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several when parallel calls
are allowed, and the variants models write instead (``<function=name>``, other tags, fenced blocks)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.json_scan import Invalid, call_object, held_back, raw, skip_ws, value_end
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN, TRIGGER_PATTERN_FULL, TRIGGER_WORD

HERMES_2_PRO = "Hermes 2 Pro"


class Hermes2Pro(Format):
    """The template writes ``<tool_call>``. A generation prompt ending in ``<think>`` leaves the thinking block open;
    with thinking off it is closed (``</think>`` appended)."""

    name: ClassVar[str] = HERMES_2_PRO

    @classmethod
    def matches(cls, source: str) -> bool:
        return "<tool_call>" in source

    closes: ClassVar[str] = "<think>\n"

    def params(self, setup: ToolSetup) -> FormatParams:
        return _hermes_2_pro(setup.request.tools, setup.required, setup.parallel, setup.thinking_open)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_hermes(text, final)


_HERMES_TAGS = ("function_call", "response", "tools", "json", "xml", "JSON")
_HERMES_PRESERVED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<function", "<tools>", "</tools>",
                     "<response>", "</response>", "<function_call>", "</function_call>", "<json>", "</json>", "<JSON>",
                     "</JSON>", "```", "```json", "```xml")


def _hermes_2_pro(tools: Sequence[Mapping[str, Any]], required: bool, parallel: bool,
                  forced_open: bool) -> FormatParams:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and the variants models write instead
    (``<function=name>``, other tags, fenced blocks)."""
    b = GrammarBuilder()
    lit = b.literal
    calls, alts, names, triggers = [], [], [], []
    for name, params in tool_names(tools):
        calls.append(b.add_schema(f"{name}-call", {"type": "object", "properties": {
            "name": {"const": name}, "arguments": params}, "required": ["name", "arguments"]}, params))
        alts.append(b.add_rule(f"{name}-function-tag", f'{lit("<function")} ( {lit("=" + name)} | '
                               f'{lit(f" name={chr(34)}{name}{chr(34)}")} ) {lit(">")} space '
                               f'{b.add_schema(f"{name}-args", params, params)} {lit("</function>")} space'))
        triggers.append((TRIGGER_WORD, f"<function={name}>"))
        triggers.append((TRIGGER_PATTERN, r'<function\s+name\s*=\s*"' + re.escape(name) + '"'))
        names.append(re.escape(name))
    any_call = b.add_rule("any_tool_call", f"( {' | '.join(calls)} ) space")
    tagged = [any_call, f'{lit("<tool_call>")} space {any_call} {lit("</tool_call>")}',
              *(f'{lit(f"<{t}>")} space {any_call} {lit(f"</{t}>")}' for t in _HERMES_TAGS)]
    wrappable = b.add_rule("wrappable_tool_call", f"( {' | '.join(tagged)} ) space")
    alts.append(wrappable)
    alts.append(f'( {lit("```" + chr(10))} | {lit("```json" + chr(10))} | {lit("```xml" + chr(10))} ) space '
                f'{wrappable} space {lit("```")} space ')
    tool_call = b.add_rule("tool_call", " | ".join(alts))
    b.add_rule("root", (f'( {lit("</think>")} space )? ' if forced_open else "")
               + (f"({tool_call})+" if parallel else tool_call))
    think = r"[\s\S]*?(</think>\s*)" if forced_open else r"(?:<think>[\s\S]*?</think>\s*)?"
    triggers.append((TRIGGER_PATTERN_FULL, think + r"(\s*(?:<tool_call>|<function|(?:```(?:json|xml)?" + "\n"
                     + r'\s*)?(?:<function_call>|<tools>|<xml><json>|<response>)?\s*\{\s*"name"\s*:\s*"(?:'
                     + "|".join(names) + r')"))[\s\S]*'))
    return FormatParams(HERMES_2_PRO, True, b.text(), not required, tuple(triggers), _HERMES_PRESERVED)


_HERMES_OPEN = re.compile(
    r'(?:(```(?:xml|json)?\n\s*)?(<tool_call>|<function_call>|<tool>|<tools>|<response>|<json>|<xml>|<JSON>)?'
    r'(\s*\{\s*"name"))|<function=([^>]+)>|<function name="([^"]+)">')
_HERMES_OPENERS = (*(f'{fence}{tag}{{"name"' for fence in ("", "```", "```xml", "```json")
                      for tag in ("", "<tool_call>", "<function_call>", "<tool>", "<tools>", "<response>", "<json>",
                                  "<xml>", "<JSON>")), "<function=", '<functionname="')


def _parse_hermes(text: str, final: bool) -> ChatMessage:
    msg = ChatMessage()
    pos = 0
    while True:
        m = _HERMES_OPEN.search(text, pos)
        if m is None:
            break
        msg.content += text[pos:m.start()]
        fence = "```" if m.group(1) else ""
        if m.group(3) is not None:
            tag = m.group(2)
            close = f"</{tag[1:]}" if tag else ""
            call, end = call_object(text, text.index("{", m.start(3)), final)
        else:
            close = "</function>"
            start = skip_ws(text, m.end())
            if start >= len(text):
                end, call = None, ToolCall(m.group(4) or m.group(5), "")
            else:
                args_end = value_end(text, start, final)
                if args_end is not None:
                    json.loads(text[start:args_end])
                call, end = ToolCall(m.group(4) or m.group(5), raw(text, start, args_end)), args_end
        if call is not None:
            msg.tool_calls.append(call)
        if end is None:
            if final:
                raise Invalid("incomplete tool call")
            return msg
        pos = skip_ws(text, end)
        for literal in (close, fence):
            if not literal:
                continue
            if not text.startswith(literal, pos):
                if final or not literal.startswith(text[pos:]):
                    raise Invalid(f"expected {literal!r}")
                return msg
            pos = skip_ws(text, pos + len(literal))
    rest = text[pos:]
    msg.content += rest if final else rest[:held_back(rest, _HERMES_OPENERS)]
    return msg
