# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are full-width characters)
"""DeepSeek R1's tool calls (``common_chat_params_init_deepseek_r1`` / ``common_chat_parse_deepseek_r1``):
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...
<｜tool▁calls▁end｜>``, after a ``<think>`` block the prompt may leave open (``<think>\\n``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import expect, json_args
from samplechain.chat.json_scan import Invalid, held_back, skip_ws
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN_FULL

DEEPSEEK_R1 = "DeepSeek R1"

# the opening tag and the variants the Distill Qwen models write instead (the fourth has literal backslashes)
CALLS_BEGIN = ("<｜tool▁calls▁begin｜>", "<｜tool_calls_begin｜>", "<｜tool calls begin｜>",
               "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
CALLS_END = "<｜tool▁calls▁end｜>"
# as llama.cpp writes the pattern (the fourth variant escaped)
BEGIN_PATTERN = "(" + "|".join(b.replace("\\", "\\\\") for b in CALLS_BEGIN) + ")"
PRESERVED = ("<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
             "<｜tool▁call▁end｜>", CALLS_END)


class DeepSeekR1(Format):
    """The template writes ``<｜tool▁calls▁begin｜>``. A generation prompt ending in ``<think>\\n`` leaves the
    thinking block open; with thinking off it is closed."""

    name: ClassVar[str] = DEEPSEEK_R1

    @classmethod
    def matches(cls, source: str) -> bool:
        return "<｜tool▁calls▁begin｜>" in source

    closes: ClassVar[str] = "<think>\n"

    def params(self, setup: ToolSetup) -> FormatParams:
        return block_params(self.name, setup, lambda name: f"function<｜tool▁sep｜>{name}\n```json\n",
                            "```<｜tool▁call▁end｜>")

    def parse(self, text: str, final: bool) -> ChatMessage:
        return parse_block(text, final, _FUNCTION, _CLOSE)


_FUNCTION = re.compile(r"(?:<｜tool▁call▁begin｜>)?function<｜tool▁sep｜>([^\n]+)\n```json\n")
_CLOSE = re.compile(r"\s*```[\s\r\n]*<｜tool▁call▁end｜>")


def block_params(name: str, setup: ToolSetup, head: Callable[[str], str], tail: str) -> FormatParams:
    """The grammar of a DeepSeek tool-call block: one opening tag, the calls (``head(name)`` then the arguments then
    ``tail``; several when parallel), the closing tag, and the trigger on the opening tag (after the thinking
    block)."""
    b = GrammarBuilder()
    lit = b.literal
    rules = [b.add_rule(f"{fn}-call", f'( {lit("<｜tool▁call▁begin｜>")} )? {lit(head(fn))} '
                        f'{b.add_schema(f"{fn}-args", params, params)} {lit(tail)}')
             for fn, params in tool_names(setup.request.tools)]
    begins = " | ".join(lit(t) for t in CALLS_BEGIN)
    b.add_rule("root", (f'( {lit("</think>")} space )? ' if setup.thinking_open else "")
               + f"( {begins} ) (" + " | ".join(rules) + ")" + ("*" if setup.parallel else "")
               + f" {lit(CALLS_END)} space")
    think = r"[\s\S]*?(</think>\s*)" if setup.thinking_open else r"(?:<think>[\s\S]*?</think>\s*)?"
    return FormatParams(name, True, b.text(), not setup.required,
                        ((TRIGGER_PATTERN_FULL, think + BEGIN_PATTERN + r"[\s\S]*"),), PRESERVED)


_BEGIN = re.compile(BEGIN_PATTERN)


def parse_block(text: str, final: bool, function: re.Pattern[str], close: re.Pattern[str]) -> ChatMessage:
    """Content, then a tool-call block (llama.cpp's ``parse_json_tool_calls`` with a block): each call found by
    ``function`` (its name in group 1; text between calls is content), JSON arguments, ``close``; then the closing
    tag and more content. A partial text holds back what may still open the block or a call."""
    m = _BEGIN.search(text)
    if m is None:
        return ChatMessage(text if final else text[:held_back(text, CALLS_BEGIN)])
    msg = ChatMessage(text[:m.start()])
    pos = m.end()
    while (f := function.search(text, pos)) is not None:
        msg.content += text[pos:f.start()]
        args, end = json_args(text, f.end(), final)
        msg.tool_calls.append(ToolCall(f.group(1), args))
        if end is None:
            return msg
        c = close.match(text, end)
        if c is None:
            if final:
                raise Invalid("expected the end of the tool call")
            return msg
        pos = c.end()
    try:
        after = expect(text, pos, CALLS_END, final)
    except Invalid:
        if final:
            raise
        return msg  # maybe a call still coming
    if after is None:
        return msg
    msg.content += text[skip_ws(text, after):]
    return msg
