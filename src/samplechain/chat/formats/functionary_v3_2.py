"""Functionary v3.2's recipients (``common_chat_params_init_functionary_v3_2`` /
``common_chat_parse_functionary_v3_2``): the answer is ``>>>all\\ntext``, ``>>>NAME\\n{args}`` or raw code after
``>>>python\\n``, one after another (the generation prompt writes the first ``>>>``)."""

from __future__ import annotations

import re
from typing import ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import code_arguments, json_args, partial_suffix
from samplechain.chat.json_scan import skip_ws
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN_FULL

FUNCTIONARY_V3_2 = "Functionary v3.2"


class FunctionaryV32(Format):
    """The template writes ``>>>all``; its answers are read with or without tools (``all\\n`` comes off)."""

    name: ClassVar[str] = FUNCTIONARY_V3_2
    reasoning: ClassVar[tuple[str, str] | None] = None
    always_parse: ClassVar[bool] = True

    @classmethod
    def matches(cls, source: str) -> bool:
        return ">>>all" in source

    def params(self, setup: ToolSetup) -> FormatParams:
        return _functionary_v3_2(setup)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_functionary(text, final)


def _functionary_v3_2(setup: ToolSetup) -> FormatParams:
    """``NAME\\n{args}`` first, then ``>>>NAME\\n{args}`` when parallel; ``python`` may take raw code; one trigger
    per function on its name line."""
    b = GrammarBuilder()
    lit = b.literal
    first, subsequent, triggers = [], [], []
    for name, params in tool_names(setup.request.tools):
        args = b.add_schema(f"{name}-args", params, params)
        pattern = r"[\s\S]*"
        if name == "python":
            args = b.add_rule(f"{name}-maybe-raw-args", f"{args} | [^{{] .*")
        else:
            pattern = r"\{" + pattern
        call = b.add_rule(f"{name}-call", f"{lit(name + chr(10))} {args}")
        first.append(call)
        if setup.parallel:
            subsequent.append(b.add_rule(f"{name}-call2", f'{lit(">>>")} {call}'))
        triggers.append((TRIGGER_PATTERN_FULL, r"((?:[\s\S]+?>>>)?" + re.escape(name) + "\n)" + pattern))
    first_rule = b.add_rule("first_tool_call", " | ".join(first)) + " space"
    if setup.parallel:
        b.add_rule("root", f"{first_rule} ({b.add_rule('subsequent_tool_call', ' | '.join(subsequent))} space)*")
    else:
        b.add_rule("root", first_rule)
    return FormatParams(FUNCTIONARY_V3_2, True, b.text(), not setup.required, tuple(triggers),
                        ("<|end_header_id|>",))


_FIRST = re.compile(r"(\w+)\n(?=\{)|(python)\n|(all)\n")
_NEXT = re.compile(r">>>(?:(\w+)\n(?=\{)|(python)\n|(all)\n)")
_MAYBE_FIRST = re.compile(r"\w*\n?")


def _parse_functionary(text: str, final: bool) -> ChatMessage:
    """llama.cpp's ``parse_json_tool_calls`` with Functionary's recipients: the first recipient at the start (``all``
    there is text), later ones after ``>>>`` (text between them is content); ``python`` not followed by ``{`` takes
    the rest as code. A text that does not start with a recipient is all content."""
    msg = ChatMessage()
    m = _FIRST.match(text)
    if m is None:
        if not final and _MAYBE_FIRST.fullmatch(text):
            return msg  # maybe a recipient, still coming
        return ChatMessage(text.lstrip())
    pos = m.end()
    first = True
    while True:
        if not first:
            m = _NEXT.search(text, pos)
            if m is None:
                break
            msg.content += text[skip_ws(text, pos):m.start()]
            pos = m.end()
        recipient = m.group(1) or m.group(2) or ""
        first = False
        if not recipient:  # all: text
            continue
        if m.group(2) and not text.startswith("{", pos):
            if pos >= len(text) and not final:
                return msg  # raw code or JSON: not known yet
            msg.tool_calls.append(ToolCall(recipient, code_arguments(text[pos:], final)))
            return msg
        args, end = json_args(text, pos, final)
        msg.tool_calls.append(ToolCall(recipient, args))
        if end is None:
            return msg
        pos = end
    rest = text[skip_ws(text, pos):]
    if not final:
        at = rest.rfind(">>>")
        rest = rest[:at] if at >= 0 and _MAYBE_FIRST.fullmatch(rest, at + 3) else rest[:partial_suffix(rest, (">>>",))]
    msg.content += rest
    return msg
